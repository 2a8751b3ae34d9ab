"""The grader service (``gagar grader serve``) and its client.

``POST /v1/grade`` takes a ``GradingGroup`` JSON and answers the ``Ranking`` JSON. Requests wait
in a bounded queue served by a fixed number of workers; when the queue is full the answer is 429
with ``Retry-After`` (back-pressure: the trainer retries or falls back, the autoscaler sees
``gagar_grader_queue_depth``). ``/healthz`` is 200 while serving and 503 while draining;
``/metrics`` is Prometheus text.

Graceful shutdown (SIGTERM, or ``stop``): listening sockets close, new requests on open
connections get 503, queued and in-flight groups are finished within ``drain_seconds``; whatever
is left after that is *returned* to its caller as 503 ("shutting down, retry elsewhere"), never
dropped silently and never answered with a made-up ranking.

Against slow or broken clients (``gagar.serving``): a request's headers must arrive within
``header_timeout_s`` (an idle keep-alive connection is closed after as long), its body within
``body_timeout_s`` (else 408), at most ``max_connections`` connections are open (the rest get
503), a caller that hangs up takes its queued group with it (aiohttp's handler cancellation),
and a failure is one log line and a JSON 500, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from dataclasses import dataclass

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from gagar import auth, serving
from gagar.grader.metrics import GraderMetrics
from gagar.grader.protocol import Grader
from gagar.wire import GradingGroup, Ranking


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    queue_size: int = 64
    workers: int = 2
    drain_seconds: float = 30.0
    max_body_bytes: int = 256 * 1024 * 1024
    body_timeout_s: float = 60.0  # the whole body must arrive within this (else 408)
    header_timeout_s: float = serving.HEADER_TIMEOUT_S  # headers, and idle keep-alive connections
    max_connections: int = serving.MAX_CONNECTIONS  # open at once; past it: 503, closed
    metrics_port: int | None = None  # also serve /metrics there (a pod's metrics port)
    token: str | None = None  # shared token every /v1/grade call must carry (gagar.auth)
    run: str | None = None  # run/pool labels of the metrics (None: from the environment)
    pool: str | None = None


class ShuttingDown(Exception):
    """The service stopped before grading this group; the caller should retry elsewhere."""


@dataclass(eq=False)  # hashed by identity: the service keeps a set of running jobs
class _Job:
    group: GradingGroup
    future: asyncio.Future[Ranking]
    enqueued: float


class GraderService:
    """Bounded queue + workers in front of one ``Grader``; ``app()`` is the aiohttp application."""

    def __init__(
        self,
        grader: Grader,
        config: ServiceConfig | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.grader = grader
        self.config = config or ServiceConfig()
        self.registry = registry or CollectorRegistry()
        self._queue: asyncio.Queue[_Job] | None = None
        self.metrics = GraderMetrics(self.registry, self.config.run, self.config.pool)
        self.metrics.queue_depth(lambda: self._queue.qsize() if self._queue else 0)
        self._workers: list[asyncio.Task] = []
        self._running: set[_Job] = set()
        self.draining = False

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[serving.errors, auth.middleware(self.config.token)],
        )
        app.router.add_post("/v1/grade", self._grade)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.on_startup.append(lambda _: self.start())
        app.on_shutdown.append(lambda _: self.drain())
        return app

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.config.queue_size)
        self._workers = [asyncio.create_task(self._work()) for _ in range(self.config.workers)]

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            try:
                if not job.future.done():
                    await self._run(job)
            finally:
                self._queue.task_done()

    async def _run(self, job: _Job) -> None:
        self.metrics.waited(time.monotonic() - job.enqueued)
        self._running.add(job)
        self.metrics.in_flight(+1)
        try:
            ranking = await self.grader.grade(job.group)
            if not job.future.done():
                job.future.set_result(ranking)
        except Exception as err:  # a grader bug: the caller gets a 500, the worker survives
            if not job.future.done():
                job.future.set_exception(err)
        finally:
            self._running.discard(job)
            self.metrics.in_flight(-1)

    async def drain(self) -> None:
        """Finish queued and in-flight work within ``drain_seconds``, return the rest as 503."""
        self.draining = True
        if self._queue is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), self.config.drain_seconds)
        leftover = list(self._running)  # before cancelling: a cancelled worker forgets its job
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        while self._queue is not None and not self._queue.empty():
            leftover.append(self._queue.get_nowait())
        for job in leftover:
            if not job.future.done():
                job.future.set_exception(
                    ShuttingDown("grader service is shutting down; retry elsewhere")
                )

    async def _grade(self, request: web.Request) -> web.Response:
        if self.draining or self._queue is None:
            return self._error(
                503, "unavailable", "grader service is shutting down; retry elsewhere"
            )
        try:
            body = await serving.read_body(request, self.config.body_timeout_s)
            group = GradingGroup.model_validate_json(body)
        except ValidationError as err:
            return self._error(400, "invalid", f"invalid grading group: {err}")
        job = _Job(group, asyncio.get_running_loop().create_future(), time.monotonic())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            return self._error(
                429,
                "rejected",
                f"queue full ({self.config.queue_size} groups waiting)",
                {"Retry-After": "1"},
            )
        try:
            ranking = await asyncio.shield(job.future)
        except asyncio.CancelledError:  # the caller went away: a queued job is skipped
            job.future.cancel()
            raise
        except ShuttingDown as err:
            return self._error(503, "unavailable", str(err))
        except Exception as err:
            return self._error(500, "error", f"grader failed: {type(err).__name__}: {err}")
        self.metrics.record(ranking)
        return web.json_response(text=ranking.model_dump_json())

    def _error(
        self, status: int, outcome: str, message: str, headers: dict | None = None
    ) -> web.Response:
        self.metrics.refused(outcome)
        return web.json_response({"error": message}, status=status, headers=headers)

    async def _healthz(self, _: web.Request) -> web.Response:
        depth = self._queue.qsize() if self._queue else 0
        body = {
            "status": "draining" if self.draining else "ok",
            "queue_depth": depth,
            "in_flight": len(self._running),
        }
        return web.json_response(body, status=503 if self.draining else 200)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def serve(service: GraderService) -> None:
    """Run until SIGINT/SIGTERM, then drain (aiohttp's runner calls ``on_shutdown``). With a
    ``metrics_port``, ``/metrics`` is served there too (a thread), where the pod's monitors and
    the autoscaler scrape ``gagar_grader_queue_depth``."""
    cfg = service.config
    if cfg.metrics_port is not None and cfg.metrics_port != cfg.port:
        start_http_server(cfg.metrics_port, addr=cfg.host, registry=service.registry)
    sock = socket.create_server((cfg.host, cfg.port), backlog=max(128, cfg.queue_size))
    asyncio.run(run(service, sock))


async def run(
    service: GraderService, sock: socket.socket, stop: asyncio.Event | None = None
) -> None:
    """Serve on ``sock`` until ``stop`` is set (SIGINT/SIGTERM set it from the main thread),
    then drain."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ValueError, RuntimeError):  # not the main thread: no signals
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    cfg = service.config
    runner = serving.runner(
        service.app(),
        cfg.header_timeout_s,
        handler_cancellation=True,
        shutdown_timeout=cfg.drain_seconds + 5,
    )
    await runner.setup()
    backlog = max(128, cfg.queue_size)
    listening = await serving.listen(runner, sock, cfg.max_connections, backlog)
    try:
        await stop.wait()
    finally:
        listening.close()
        await runner.cleanup()


_JSON = {"Content-Type": "application/json"}


class GraderUnavailable(Exception):
    """No ranking from the service after the retries (queue full, shutting down, errors)."""


class GraderClient:
    """Client of ``/v1/grade``: retries 429/503 with backoff (honouring ``Retry-After``)."""

    def __init__(
        self, base_url: str, timeout: float = 900.0, retries: int = 5, backoff: float = 0.5
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    async def grade(self, group: GradingGroup) -> Ranking:
        body = group.model_dump_json()
        last = ""
        async with httpx.AsyncClient(timeout=self.timeout, headers=auth.headers()) as http:
            for attempt in range(self.retries + 1):
                resp: httpx.Response | None = None
                try:
                    resp = await http.post(f"{self.base_url}/v1/grade", content=body, headers=_JSON)
                except httpx.TransportError as err:
                    last = f"{type(err).__name__}: {err}"
                else:
                    if resp.status_code == 200:
                        return Ranking.model_validate_json(resp.content)
                    last = f"HTTP {resp.status_code}: {resp.text[:500]}"
                    if resp.status_code not in (429, 503):
                        raise GraderUnavailable(last)
                if attempt < self.retries:
                    await asyncio.sleep(self._delay(attempt, resp))
        raise GraderUnavailable(f"no ranking after {self.retries + 1} attempts; last: {last}")

    def _delay(self, attempt: int, resp: httpx.Response | None) -> float:
        hint = resp.headers.get("Retry-After") if resp is not None else None
        base = float(hint) if hint and hint.replace(".", "", 1).isdigit() else 0.0
        return max(base, self.backoff * 2**attempt)

    def grade_sync(self, group: GradingGroup) -> Ranking:
        return asyncio.run(self.grade(group))
