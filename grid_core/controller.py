"""The controller: one tick turns demand and host snapshots into a plan and safe commands.

CONTRACT (filled in by the controller work; the server codes against these signatures).
Pure and synchronous: no sockets, threads or clock reads; every method takes ``now``
(wall-clock Unix seconds) and the caller serialises access (one lock in the server).

Lifecycle in the server::

    ctl = Controller(plugins=plugins, store=FileStateStore(path))   # restores durable state
    ctl.put_profile(profile, now)            # PUT /allocator/models/{id}
    ctl.remove_profile(model_id, now)        # DELETE /allocator/models/{id} (tombstone)
    ctl.set_mode("automatic", now)           # PUT /allocator/mode
    ctl.observe_request(features)            # every finished request (bounded features)
    ctl.note_input(now, safety=...)          # registration/heartbeat changed → dirty revision
    result = ctl.tick(now, hosts)            # periodic + coalesced prompt ticks
    cmds = ctl.commands_for(host_id, now, hosts, poll_revision)  # heartbeat response
    ctl.mark_delivered(action_ids, now)      # durably, before the response leaves
    ctl.acknowledge(host_id, ack, now)       # acknowledgements in heartbeats
    ctl.status(now, detail=True)             # GET /allocator/status
"""

from __future__ import annotations
