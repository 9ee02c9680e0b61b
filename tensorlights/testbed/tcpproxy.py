"""A TCP relay on loopback that a test can cut: the partition of one process from a service
(a controller replica from etcd) without touching any other process's path to it.

Cut, it relays nothing and answers nothing: connections stay open and silent, new ones are
accepted and left hanging, as packets dropped by a partition look to the client (no refusal
to react to: only its timeouts tell). Healed, new connections are relayed again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

CHUNK = 65536


class CuttableProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
            self._sockets.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._keep(client)
            if self._cut.is_set():
                continue  # accepted, and left silent
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._keep(upstream)
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        self._pump(client, upstream)
        back.join()
        for sock in (client, upstream):  # both directions done: release the descriptors
            with contextlib.suppress(OSError):
                sock.close()
            with self._lock, contextlib.suppress(ValueError):
                self._sockets.remove(sock)

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self._closed.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                while self._cut.is_set() and not self._closed.is_set():
                    self._closed.wait(0.05)  # frozen: the bytes go nowhere for now
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
