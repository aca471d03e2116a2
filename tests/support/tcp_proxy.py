"""A loopback TCP relay a test can cut and heal: a network partition between two processes.

A Grid server pointed at the relay instead of etcd loses etcd the moment :meth:`TcpRelay.cut`
runs (open connections are closed, new ones are accepted and closed at once) and gets it back
with :meth:`TcpRelay.heal`. Everything stays on loopback; :meth:`close` stops the threads.
"""

from __future__ import annotations

import contextlib
import socket
import threading

CHUNK = 65536
"""Bytes per read: etcd gateway requests and answers are small JSON documents."""


class TcpRelay:
    """Relay ``127.0.0.1:<port>`` to ``target`` until cut.

    Args:
        target_host / target_port: where connections are relayed.

    Attributes:
        port: the loopback port to connect to instead of the target.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="tcp-relay", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Partition: close every relayed connection and refuse new ones until :meth:`heal`."""
        self._cut.set()
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def heal(self) -> None:
        """End the partition: new connections are relayed again."""
        self._cut.clear()

    def close(self) -> None:
        """Stop relaying and close everything."""
        self._closed.set()
        self.cut()
        self._listener.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for s in (src, dst):
                    self._open.discard(s)
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
