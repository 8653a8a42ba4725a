"""A customer's webhook endpoint for tests: a real HTTP server on loopback, on a thread of
its own (so it outlives one test's event loop), that records every delivery and answers
with the statuses it is told to."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True, slots=True)
class Received:
    """One delivery as it arrived."""

    body: bytes
    headers: dict[str, str]


@dataclass
class WebhookReceiver:
    """Answers the first deliveries with ``statuses`` in turn, then 200."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    arrived: queue.Queue[Received] = field(default_factory=lambda: queue.Queue(1000))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, delivery: Received) -> int:
        """Keep a delivery; the status to answer it with."""
        with self.lock:
            self.received.append(delivery)
            status = self.statuses.pop(0) if self.statuses else 200
        self.arrived.put_nowait(delivery)
        return status

    def next(self, timeout_s: float = 30.0) -> Received:
        """The next delivery to arrive (blocking: from async code, in a thread)."""
        return self.arrived.get(timeout=timeout_s)


@contextlib.contextmanager
def webhook_receiver(statuses: list[int] | None = None) -> Iterator[WebhookReceiver]:
    """A running receiver at ``receiver.url`` (``/webhook`` on an ephemeral port)."""
    receiver = WebhookReceiver(statuses=list(statuses or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            status = receiver.record(Received(body, dict(self.headers.items())))
            answer = b"ok" if status < 300 else b"try again"
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="webhook receiver", daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/webhook"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
