"""``hark serve --workers N``: N server processes accepting on one listening socket.

The parent binds the port once and starts N workers (fresh interpreters, ``spawn``), each
with the socket, its own engines and its own event loop. The kernel hands each new
connection to one worker, and a session lives and ends on the worker that accepted it; a
busy worker accepts less, because it calls ``accept`` less often. Each worker loads its own
models, so memory grows with N.

Before any worker starts, the parent points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh private
directory, so a ``/metrics`` scrape of any worker shows the whole server. WebRTC needs one
UDP port per worker: worker i takes ``rtc_port + i`` (any free port when ``rtc_port`` is 0).
SIP runs on the first worker alone, so that a trunk dials one address.

The workers share ephemeral keys, calls and per-key limits through the cluster store: an
embedded one in a private run directory the parent makes, or Redis with ``--redis-url``.
Each worker also listens on a port of its own, which it advertises in the store, so that a
request for a call another worker owns reaches that worker.

The parent forwards SIGINT and SIGTERM to the workers (on SIGTERM each drains first), waits
for them to finish, and restarts a worker that dies unexpectedly (a few times a minute at
most).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType

from hark.config import Settings
from hark.observability.metrics import MULTIPROC_ENV

logger = logging.getLogger(__name__)

# A worker that exits with this status could not start (bad settings): restarting is futile.
EXIT_USAGE = 2
# More restarts than this in RESTART_WINDOW_S means something is wrong with every worker.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
# Beyond the drain, the workers' own shutdown takes up to 5 s; then they are killed.
STOP_TIMEOUT_S = 15.0
_POLL_S = 0.5


def run_workers(settings: Settings) -> int:
    """Serve with ``settings.workers`` processes until SIGINT or SIGTERM; the exit status."""
    from hark.server.auth import InsecureBindError, check_bind_policy

    try:
        check_bind_policy(settings.host, settings.api_keys)
    except InsecureBindError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    try:
        sock = listening_socket(settings.host, settings.port)
    except OSError as exc:
        logger.error("cannot listen on %s port %d: %s", settings.host, settings.port, exc)
        return 1
    metrics_dir = tempfile.mkdtemp(prefix="hark-metrics-")
    # The workers share ephemeral keys, calls and limits through one embedded store here,
    # unless a Redis shares them across hosts.
    own_run_dir = settings.run_dir is None and not settings.redis_url
    if own_run_dir:
        settings = dataclasses.replace(settings, run_dir=tempfile.mkdtemp(prefix="hark-run-"))
    # Inherited by every worker, which must see it before it first imports prometheus_client.
    os.environ[MULTIPROC_ENV] = metrics_dir
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, _set_on_signal(stop)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        return _supervise(settings, sock, metrics_dir, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if own_run_dir and settings.run_dir is not None:
            shutil.rmtree(settings.run_dir, ignore_errors=True)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, to be shared by the workers."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def worker_settings(settings: Settings, index: int) -> Settings:
    """Worker ``index``'s settings: one process each, a WebRTC UDP port and a TLS hop port
    of its own, and SIP on the first worker only (a trunk points at one address; the
    accept, reject, refer and hangup requests reach that worker from any other)."""
    rtc_port = settings.rtc_port + index if settings.rtc_port else 0
    hop_port = settings.hop_port + index if settings.hop_port else 0
    return dataclasses.replace(
        settings,
        workers=1,
        rtc_port=rtc_port,
        hop_port=hop_port,
        sip=settings.sip and index == 0,
    )


def _supervise(
    settings: Settings, sock: socket.socket, metrics_dir: str, stop: threading.Event
) -> int:
    context = multiprocessing.get_context("spawn")
    workers: list[BaseProcess] = []
    restarts: deque[float] = deque()
    status = 0

    def start(index: int) -> BaseProcess:
        process = context.Process(
            target=_worker_main,
            args=(worker_settings(settings, index), sock, index),
            name=f"hark-worker-{index}",
        )
        process.start()
        logger.info("worker %d started (pid %s)", index, process.pid)
        return process

    try:
        workers = [start(index) for index in range(settings.workers)]
        while not stop.wait(_POLL_S):
            for index, process in enumerate(workers):
                if process.is_alive():
                    continue
                _forget(process, metrics_dir)
                if process.exitcode == EXIT_USAGE:
                    logger.error("worker %d could not start; stopping", index)
                    stop.set()
                    status = EXIT_USAGE
                    break
                now = time.monotonic()
                while restarts and now - restarts[0] > RESTART_WINDOW_S:
                    restarts.popleft()
                if len(restarts) >= MAX_RESTARTS:
                    logger.error("workers keep dying; stopping")
                    stop.set()
                    status = 1
                    break
                restarts.append(now)
                logger.error("worker %d exited (%s); restarting it", index, process.exitcode)
                workers[index] = start(index)
    finally:
        _stop_all(workers, metrics_dir, settings.drain_timeout + STOP_TIMEOUT_S)
    return status


def _stop_all(workers: list[BaseProcess], metrics_dir: str, timeout_s: float) -> None:
    # SIGTERM: each worker drains (up to --drain-timeout), then shuts down.
    for process in workers:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.error("worker pid %s did not stop in time; killing it", process.pid)
            process.kill()
            process.join()
        _forget(process, metrics_dir)


def _forget(process: BaseProcess, metrics_dir: str) -> None:
    """Drop a dead worker's live gauges (active sessions, memory) from the metrics."""
    from prometheus_client import multiprocess

    if process.pid is not None:
        multiprocess.mark_process_dead(process.pid, metrics_dir)


def _set_on_signal(stop: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return handler


def _worker_main(settings: Settings, sock: socket.socket, index: int) -> None:
    """A worker process: the usual server, on the parent's socket."""
    import sys

    from hark.eventloop import run_event_loop
    from hark.observability.logging import configure_logging
    from hark.server.serving import serve

    configure_logging(settings.log_level)
    logging.getLogger("hark").info("worker %d serving (pid %d)", index, os.getpid())
    try:
        status = run_event_loop(serve(settings, sock=sock))
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)
