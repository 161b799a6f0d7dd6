"""A TCP forwarder that can be cut: the embedded stack's way to take S3 away without losing its data.

The embedded S3 (moto) keeps its objects in memory, so stopping the process would lose them. With
`EmbeddedStack(s3_switch=True)` every client and tritonserver reaches S3 through this forwarder;
`cut()` closes the listening port and every open connection (clients see "connection refused" and
resets, as when an S3 endpoint goes away) and `restore()` opens the same port again.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class TcpSwitch:
    def __init__(self, upstream_port: int, port: int) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self.restore()

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    def restore(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(128)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, set()
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in connections:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    client.close()
                    upstream.close()
                    return
                self._connections.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._connections.discard(source)
                self._connections.discard(sink)
            source.close()
