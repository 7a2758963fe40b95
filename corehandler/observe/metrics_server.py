"""The /metrics HTTP server, bounded: one selector thread and a few workers, whatever the clients do.

Anyone who can reach the port may connect (the agent listens on the pod's address), so a connection costs no
thread until its request has arrived whole: the selector thread accepts, reads request heads into buffers, and
hands a complete one to a worker of a fixed pool, which answers through prometheus_client's WSGI app and closes
the connection (no keep-alive: Prometheus reconnects per scrape happily). A head must arrive within
HEAD_TIMEOUT of the connect and fit in HEAD_MAX bytes; at most MAX_CONNECTIONS wait at once, the oldest closed
to make room for a new one; an answer must be taken within SEND_TIMEOUT. 300 idle connections cost 300 file
descriptors for HEAD_TIMEOUT and no thread.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

log = logging.getLogger(__name__)

WORKERS = 2
MAX_CONNECTIONS = 64
HEAD_TIMEOUT = 10.0
HEAD_MAX = 8192
SEND_TIMEOUT = 10.0


class MetricsServer:
    """Serves a WSGI app on (listen, port); `server_address` is the bound address, `close()` stops it."""

    def __init__(self, app, listen: str, port: int):
        self._app = app
        family = socket.AF_INET6 if ":" in listen else socket.AF_INET
        self._listener = socket.create_server((listen, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._waiting: OrderedDict[socket.socket, tuple[float, bytearray]] = OrderedDict()
        self._busy = 0  # requests handed to the pool and not answered yet
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="metrics")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    for key, _ in self._selector.select(timeout=0.5):
                        if key.fileobj is self._listener:
                            self._accept()
                        elif key.fileobj in self._waiting:
                            self._read(key.fileobj)
                    self._expire(time.monotonic() - HEAD_TIMEOUT)
                except Exception as e:  # one client's oddity must not end the server
                    log.warning("metrics: %s", e, exc_info=e)
        finally:
            for conn in list(self._waiting):
                self._drop(conn)
            self._selector.close()
            self._listener.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as e:  # EMFILE and the like: the connections waiting go first, then it is tried again
            log.warning("metrics: cannot accept a connection: %s", e)
            self._expire(time.monotonic())
            return
        with self._lock:
            busy = self._busy
        if len(self._waiting) + busy >= MAX_CONNECTIONS:
            if not self._waiting:
                conn.close()
                return
            self._drop(next(iter(self._waiting)))
        conn.setblocking(False)
        self._waiting[conn] = (time.monotonic(), bytearray())
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(HEAD_MAX)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        head = self._waiting[conn][1]
        head += data
        if not data or len(head) > HEAD_MAX:
            self._drop(conn)
        elif b"\r\n\r\n" in head or b"\n\n" in head:
            self._selector.unregister(conn)
            del self._waiting[conn]
            with self._lock:
                self._busy += 1
            self._pool.submit(self._answer, conn, bytes(head))

    def _expire(self, before: float) -> None:
        for conn, (since, _) in list(self._waiting.items()):
            if since > before:
                break
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        del self._waiting[conn]
        conn.close()

    def _answer(self, conn: socket.socket, head: bytes) -> None:
        try:
            with conn:
                conn.settimeout(SEND_TIMEOUT)
                conn.sendall(self._response(head))
        except OSError:
            pass
        finally:
            with self._lock:
                self._busy -= 1

    def _response(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        method, target, _ = parts
        path, _, query = target.partition("?")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": unquote(path), "QUERY_STRING": query,
                   "SERVER_NAME": str(self.server_address[0]), "SERVER_PORT": str(self.server_address[1]),
                   "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http"}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                environ["HTTP_" + name.strip().upper().replace("-", "_")] = value.strip()
        answer = {}

        def start_response(status, headers, exc_info=None):
            answer.update(status=status, headers=headers)

        try:
            body = b"".join(self._app(environ, start_response))
        except Exception as e:  # a collector's error: the scrape fails, the server stays
            log.warning("metrics: a scrape failed: %s", e, exc_info=e)
            return b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        headers = [(k, v) for k, v in answer["headers"] if k.lower() not in ("content-length", "connection")]
        text = f"HTTP/1.1 {answer['status']}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
        text += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        return text.encode("latin-1") + (b"" if method == "HEAD" else body)
