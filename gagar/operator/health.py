"""The operator's probes, answered in every replica: ``/healthz`` (liveness) and ``/readyz``.

Why not kopf's liveness endpoint: with leader election only the leader runs kopf, so a follower
served nothing, and the chart's probes restarted it every ~70 s and never counted it Ready (a
rolling update stalled). Here one small server runs from the process's start, whatever its role:

- a follower is alive while its lease loop keeps trying (``lease_tried``: every retry period,
  whether the API answered or not; a try hung on a dead connection stops the beats), and ready
  as soon as it is alive: it stands by to take over, which is its job;
- a leader (or a single replica without election) is alive while kopf's event loop answers
  (what kopf's own endpoint measured: it answered from that loop) and, with election, while its
  lease loop beats; it is ready once kopf has started (its start-up handlers ran).

What it does not check: that reconciles succeed (an API outage must not restart every replica;
the run's conditions and the operator's metrics say that).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOP_ANSWER_S = 2.0  # kopf's loop must run a callback within this (the chart's timeout is 5 s)
START_GRACE_S = 120.0  # kopf may take this long to start once it should (discovery, indexing)


@dataclass
class Health:
    """What this replica's probes answer. ``lease_stale_s``: how long the lease loop may go
    without a try (None: no election). ``clock``: ``time.monotonic`` (tests pass their own)."""

    lease_stale_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    _lease_beat: float = field(default=0.0, init=False)
    _kopf_due: float | None = field(default=None, init=False)  # when kopf was asked to start
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._lease_beat = self.clock()
        if self.lease_stale_s is None:  # no election: kopf starts at once
            self.leading()

    def lease_tried(self) -> None:
        """The lease loop tried to acquire or renew the Lease (either outcome)."""
        self._lease_beat = self.clock()

    def leading(self) -> None:
        """kopf is starting in this process (it leads, or runs alone)."""
        self._kopf_due = self.clock()

    def kopf_started(self, loop: asyncio.AbstractEventLoop) -> None:
        """kopf's start-up handlers run in ``loop``: from now on it must answer."""
        self._loop = loop

    def alive(self) -> bool:
        if self.lease_stale_s is not None and self.clock() - self._lease_beat > self.lease_stale_s:
            return False
        if self._kopf_due is None:  # a follower: the lease loop is all it runs
            return True
        if self._loop is None:
            return self.clock() - self._kopf_due < START_GRACE_S
        return _answers(self._loop)

    def ready(self) -> bool:
        return self.alive() and (self._kopf_due is None or self._loop is not None)


def _answers(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` runs a callback within ``LOOP_ANSWER_S`` (False once it is closed)."""
    done = threading.Event()
    try:
        loop.call_soon_threadsafe(done.set)
    except RuntimeError:  # closed: kopf has ended
        return False
    return done.wait(LOOP_ANSWER_S)


def serve(health: Health, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve ``/healthz`` and ``/readyz`` on ``port`` from a daemon thread; the server (its
    ``shutdown()`` stops it)."""
    checks = {"/healthz": health.alive, "/readyz": health.ready}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib calls it by this name
            check = checks.get(self.path.split("?", 1)[0])
            ok = check is not None and check()
            code = 200 if ok else 404 if check is None else 503
            body = json.dumps({"ok": ok}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a probe every few seconds is not worth a log line

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gagar-health", daemon=True).start()
    return server
