"""A private network lab: Linux network namespaces joined by one bridge (root only).

Each host of the lab is a network namespace with one veth link to a bridge in the caller's
namespace; addresses come from 198.18.0.0/15, the range reserved for network benchmarking
(RFC 2544), one /24 per lab. The bridge has no uplink and forwards only between the lab's
own links, so no packet leaves the lab. The bridge also carries an address, so the process
that built the lab reaches every host directly.

Names carry the creating process's id and a random tag, so two labs (two test runs, two
benchmarks) never collide. :meth:`NetLab.close` removes everything the lab made: it stops
every process still inside a lab namespace (membership in a namespace this lab created, plus
the process's birth time taken at listing, is the identity proof), then deletes the links,
the namespaces and the bridge. It is idempotent and runs every step even when one fails.

Used by the multi-host end-to-end test (``tests/support/netns.py``) and by ``grid bench proxy
--tls``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grid_core.errors import UnavailableError
from grid_core.system.identity import ProcessIdentity, birth_of
from grid_core.system.stop import stop_process_sync

LAB_SUPERNET = ipaddress.ip_network("198.18.0.0/15")
"""The benchmarking range (RFC 2544): never routed on the Internet or a company LAN."""
BRIDGE_HOST = 254
"""Last octet of the bridge's own address in each lab /24 (hosts take 1, 2, 3, ...)."""
MAX_HOSTS = 200
"""Hosts per lab: far above any test's needs, well inside one /24."""
IP_TIMEOUT_S = 20.0
"""One ``ip`` command; they take milliseconds, even on a loaded machine."""
STOP_GRACE_S = 10.0
"""Seconds a process left in a lab namespace gets after SIGTERM at teardown."""
NETNS_DIR = Path("/run/netns")
"""Where ``ip netns add`` mounts named namespaces."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        msg = f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}"
        raise UnavailableError(msg)
    return done


def unavailable_reason() -> str | None:
    """Why a lab cannot be built here (``None``: it can).

    Checks root, the ``ip`` tool, and that a namespace can really be created and deleted (a
    container without CAP_SYS_ADMIN fails there).
    """
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the suite as root)"
    if shutil.which("ip") is None:
        return "the 'ip' tool (iproute2) is not installed"
    probe = f"gridprobe-{os.getpid()}-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _lab_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 of the lab range not already routed in this namespace, starting at ``seed``."""
    routes = _ip("-4", "route", "show").stdout
    subnets = list(LAB_SUPERNET.subnets(new_prefix=24))
    for i in range(len(subnets)):
        net = subnets[(seed + i) % len(subnets)]
        if str(net) not in routes:
            assert isinstance(net, ipaddress.IPv4Network)
            return net
    msg = "every /24 of 198.18.0.0/15 is in use in this namespace; remove stale labs"
    raise UnavailableError(msg)


@dataclass
class LabHost:
    """One host of the lab.

    Attributes:
        name: the lab's name for it (``server``, ``node-a``...).
        netns: its network namespace's name.
        address: its IPv4 address on the lab link.
        link: the bridge-side end of its veth pair (down = the host is cut off).
    """

    name: str
    netns: str
    address: str
    link: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``, the tool by absolute
        path so that ``posix_spawn`` needs no PATH search)."""
        return [shutil.which("ip") or "/usr/sbin/ip", "netns", "exec", self.netns, *argv]

    def namespace_inode(self) -> int | None:
        """Inode of this host's namespace (``None`` once deleted)."""
        try:
            return os.stat(NETNS_DIR / self.netns).st_ino
        except OSError:
            return None

    def pids(self) -> list[int]:
        """Processes running inside this host's namespace now."""
        done = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in done.stdout.split() if p.isdigit()]


@dataclass
class NetLab:
    """Network namespaces joined by a bridge; use as a context manager.

    Args:
        names: the hosts to create, e.g. ``("server", "node-a", "node-b")``.

    Attributes:
        hosts: the hosts by name, once built.
        subnet: the lab's /24 (inside 198.18.0.0/15).
        gateway: the bridge's address (the building process reaches hosts from it).
    """

    names: Sequence[str]
    hosts: dict[str, LabHost] = field(default_factory=dict)
    subnet: ipaddress.IPv4Network | None = None
    gateway: str = ""
    tag: str = field(default_factory=lambda: f"{os.getpid() % 100000}{secrets.token_hex(2)}")
    _bridge: str = ""
    _links: list[str] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)

    def __enter__(self) -> NetLab:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self) -> None:
        """Create the bridge, the namespaces, the links and the addresses.

        Raises:
            UnavailableError: an ``ip`` command failed (its message is quoted); what was made
                so far is left for :meth:`close`.
        """
        if not 1 <= len(self.names) <= MAX_HOSTS:
            msg = f"a lab has 1..{MAX_HOSTS} hosts, not {len(self.names)}"
            raise UnavailableError(msg)
        self.subnet = _lab_subnet(os.getpid())
        base = self.subnet.network_address
        # Interface names are at most 15 characters: "gb" / "gv" + tag + index.
        self._bridge = f"gb{self.tag}"[:15]
        _ip("link", "add", self._bridge, "type", "bridge")
        self._links.append(self._bridge)
        self.gateway = str(base + BRIDGE_HOST)
        _ip("addr", "add", f"{self.gateway}/24", "dev", self._bridge)
        _ip("link", "set", self._bridge, "up")
        for i, name in enumerate(self.names, start=1):
            netns = f"grid-lab-{self.tag}-{i}"
            _ip("netns", "add", netns)
            self._namespaces.append(netns)
            outer, inner = f"gv{self.tag}{i}"[:15], f"gp{self.tag}{i}"[:15]
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._links.append(outer)
            _ip("link", "set", inner, "netns", netns)
            _ip("-n", netns, "link", "set", inner, "name", "eth0")
            address = str(base + i)
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("link", "set", outer, "master", self._bridge)
            _ip("link", "set", outer, "up")
            self.hosts[name] = LabHost(name=name, netns=netns, address=address, link=outer)

    def host(self, name: str) -> LabHost:
        """The host called ``name``."""
        return self.hosts[name]

    def link_down(self, name: str) -> None:
        """Cut ``name`` off the lab (its link loses carrier; processes keep running)."""
        _ip("link", "set", self.hosts[name].link, "down")

    def link_up(self, name: str) -> None:
        """Reconnect ``name``."""
        _ip("link", "set", self.hosts[name].link, "up")

    def processes(self) -> list[ProcessIdentity]:
        """Every process inside a lab namespace, with its birth time (all of them were started
        there by the lab's user: the namespaces are private to this lab)."""
        out: list[ProcessIdentity] = []
        for host in self.hosts.values():
            inode = host.namespace_inode()
            for pid in host.pids():
                try:
                    if os.stat(f"/proc/{pid}/ns/net").st_ino != inode:
                        continue
                except OSError:
                    continue
                birth = birth_of(pid)
                if birth is not None:
                    out.append(ProcessIdentity(pid, birth))
        return out

    def stop_processes(self) -> list[int]:
        """Stop every process left in the lab (SIGTERM, then SIGKILL); their PIDs."""
        stopped: list[int] = []
        for ident in self.processes():
            with contextlib.suppress(Exception):
                stop_process_sync(ident, grace_s=STOP_GRACE_S)
                stopped.append(ident.pid)
        return stopped

    def close(self) -> None:
        """Remove everything the lab made (idempotent; every step runs even if one fails)."""
        with contextlib.suppress(Exception):
            self.stop_processes()
        for link in reversed(self._links):
            _ip("link", "del", link, check=False)
        self._links.clear()
        for netns in self._namespaces:
            _ip("netns", "del", netns, check=False)
        self._namespaces.clear()


__all__ = ["LAB_SUPERNET", "LabHost", "NetLab", "unavailable_reason"]
