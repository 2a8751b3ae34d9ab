"""``gagar sandbox serve``: local sessions over HTTP, for executor servers in sandbox pods.

JSON over HTTP on aiohttp (as the grader service); the blocking session calls run in a thread
pool sized for the session limit, one call at a time per session:

=======  ==============================  ==============================================
POST     /v1/sessions                    ``{files?, tarball_b64?, limits?}`` → ``{id}``;
                                         ``{tarball_b64, limits?, verification: true,
                                         preload?}``: a verification station (``station.py``)
POST     /v1/sessions/{id}/exec          ``{cmd, timeout?}`` → ``ExecResult``
POST     /v1/sessions/{id}/read          ``{path}`` → ``{content_b64}``
POST     /v1/sessions/{id}/write         ``{path, content_b64}``
POST     /v1/sessions/{id}/delete        ``{path}``
GET      /v1/sessions/{id}/files         → ``{files}``
GET      /v1/sessions/{id}/diff          → ``{diff}`` (unified diff against the base)
GET      /v1/sessions/{id}/archive       → ``{tarball_b64}``
POST     /v1/sessions/{id}/reset
DELETE   /v1/sessions/{id}
GET      /healthz                        → ``{ok, sessions, isolation}`` (the mode it runs)
GET      /metrics                        Prometheus text format
=======  ==============================  ==============================================

Metrics: the catalogue's ``gagar_sandbox_*`` series, labelled with the server's run and pool
(``gagar.sandbox.metrics``).

A refused request (bad path, unknown session, invalid body) is 400/404 with ``{"error"}``; a full
server is 503. What a hostile or broken client cannot do: send a body past ``max_body_bytes``
(whatever its ``Content-Length`` says), send it slower than ``body_timeout_s``, pass a number that
is not finite or out of bounds (NaN, infinite or hour-long timeouts), open more than
``max_sessions`` sessions (the limit is checked and taken in one step of the event loop), keep a
session it abandoned (closed after ``idle_timeout_s`` unused), or leave sessions behind by
stopping the server (SIGTERM and SIGINT close every session; after a SIGKILL the next server
reclaims them as it starts, ``sweep_stale_sessions``, and a running one every
``min(30 s, idle_timeout_s / 4)``), send its headers slower than
``header_timeout_s`` or keep an idle connection longer, hold more than ``max_connections``
connections (the rest get 503), or get a traceback into the log (``gagar.serving``). With ``GAGAR_AUTH_TOKEN_FILE`` set
(``gagar.auth``) every call but ``/healthz`` and ``/metrics`` needs the shared token; otherwise
the server must only be reachable by its trainer (127.0.0.1 by default; the pod's NetworkPolicy).
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gagar import auth, serving
from gagar.sandbox.isolation import REPORTED
from gagar.sandbox.local import LocalFactory, LocalSession, sweep_stale_sessions
from gagar.sandbox.metrics import CONTENT_TYPE_LATEST, SandboxMetrics
from gagar.sandbox.station import Station
from gagar.sandbox.types import MAX_WALL_S, Limits, SandboxError, SessionRequest

MAX_BODY = 256 << 20
MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"  # a module's dotted name


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8700
    max_sessions: int = 64
    idle_timeout_s: float = 1800.0  # a session unused this long is closed (its client vanished)
    max_body_bytes: int = MAX_BODY
    body_timeout_s: float = 60.0  # a request body must arrive within this
    header_timeout_s: float = serving.HEADER_TIMEOUT_S  # headers, and idle keep-alive connections
    max_connections: int = serving.MAX_CONNECTIONS  # open at once; past it: 503, closed
    token: str | None = None  # shared token (gagar.auth); None: no authentication
    backlog: int = 0  # listen backlog; 0: 4 per session, at least 128

    @property
    def listen_backlog(self) -> int:
        return self.backlog or max(128, 4 * self.max_sessions)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CreateBody(_Body):
    files: dict[str, str] | None = None
    tarball_b64: str | None = None
    limits: Limits | None = None
    # A session for one verification: a station of the server's (``station.py``), whose fork
    # server imports these modules (of the executor's environment) besides pytest.
    verification: bool = False
    preload: list[Annotated[str, StringConstraints(pattern=MODULE, max_length=100)]] = Field(
        default_factory=list, max_length=64
    )


class ExecBody(_Body):
    cmd: str | list[str]
    timeout: float | None = Field(default=None, gt=0, le=MAX_WALL_S)


class PathBody(_Body):
    path: str


class WriteBody(_Body):
    path: str
    content_b64: str


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Entry:
    session: LocalSession | Station
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class Registry:
    """Live sessions by id; one call at a time per session, in the server's thread pool.

    All bookkeeping happens on the event loop's thread, so checking and taking a slot of
    ``max_sessions`` is one step nothing can interleave with.
    """

    def __init__(
        self,
        factory: LocalFactory,
        max_sessions: int,
        idle_timeout_s: float,
        labels: dict[str, str | None] | None = None,
    ) -> None:
        self.factory, self.max_sessions, self.idle_timeout_s = factory, max_sessions, idle_timeout_s
        self.sessions: dict[str, _Entry] = {}
        self.reserved = 0  # slots taken by sessions being created right now
        self.pool = ThreadPoolExecutor(max_sessions + 4, thread_name_prefix="sandbox")
        self.metrics = SandboxMetrics(lambda: len(self.sessions), max_sessions, **(labels or {}))
        self.metrics.isolation(REPORTED[factory.isolation])

    async def _blocking(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def create(self, body: CreateBody) -> str:
        if len(self.sessions) + self.reserved >= self.max_sessions:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "too many sessions")
        self.reserved += 1
        try:
            tar = base64.b64decode(body.tarball_b64) if body.tarball_b64 else None
            request = SessionRequest(
                body.files,
                tar,
                body.limits,
                verification=body.verification,
                preload=tuple(body.preload),
            )
            session = await self._blocking(self.factory.open, request)
        finally:
            self.reserved -= 1
        sid = uuid.uuid4().hex
        self.sessions[sid] = _Entry(session)
        return sid

    def _get(self, sid: str) -> _Entry:
        if sid not in self.sessions:
            raise HttpError(HTTPStatus.NOT_FOUND, f"unknown session {sid}")
        return self.sessions[sid]

    async def call(self, sid: str, action: str, raw: dict[str, Any]) -> dict[str, Any]:
        entry = self._get(sid)
        async with entry.lock:
            entry.last_used = time.monotonic()
            try:
                return await self._blocking(_session_call, entry.session, action, raw, self.metrics)
            finally:
                entry.last_used = time.monotonic()

    async def close(self, sid: str) -> None:
        entry = self._get(sid)
        async with entry.lock:
            if self.sessions.pop(sid, None) is not None:
                await self._blocking(entry.session.close)

    async def expire_idle(self) -> int:
        """Close the sessions nobody used for ``idle_timeout_s``; returns how many."""
        cutoff = time.monotonic() - self.idle_timeout_s
        idle = [s for s, e in self.sessions.items() if e.last_used < cutoff and not e.lock.locked()]
        for sid in idle:
            await self.close(sid)
        return len(idle)

    async def sweep(self) -> int:
        """Reclaim what dead sessions under the root left (another executor's killed there, or
        this one's predecessor); how many."""
        return await self._blocking(sweep_stale_sessions, self.factory.root)

    def close_all(self) -> None:
        """Close every session (blocking; after the server stopped, or from its clean-up)."""
        while self.sessions:
            _, entry = self.sessions.popitem()
            entry.session.close()
        self.factory.stations.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _session_call(
    session: LocalSession, action: str, raw: dict[str, Any], metrics: SandboxMetrics
) -> dict[str, Any]:
    """One action on one session (already locked)."""
    if action == "exec":
        body = ExecBody.model_validate(raw)
        result = session.exec(body.cmd, body.timeout)
        metrics.observe(result)
        return result.model_dump()
    if action == "read":
        return {"content_b64": _b64(session.read_file(PathBody.model_validate(raw).path))}
    if action == "write":
        w = WriteBody.model_validate(raw)
        session.write_file(w.path, base64.b64decode(w.content_b64))
        return {}
    if action == "delete":
        session.delete_file(PathBody.model_validate(raw).path)
        return {}
    if action == "files":
        return {"files": session.list_files()}
    if action == "diff":
        return {"diff": session.diff()}
    if action == "archive":
        return {"tarball_b64": _b64(session.archive())}
    if action == "reset":
        session.reset()
        return {}
    raise HttpError(HTTPStatus.NOT_FOUND, f"unknown action {action!r}")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every refusal as ``{"error"}`` JSON with its status; the server's own failures as 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:  # aiohttp's own: 413 body too large, 404 no route, ...
        return web.json_response({"error": e.reason}, status=e.status)
    except HttpError as e:
        status, message = e.status, str(e)
    except ValidationError as e:
        status, message = HTTPStatus.BAD_REQUEST, f"invalid request: {e}"
    except (SandboxError, ValueError) as e:
        status, message = HTTPStatus.BAD_REQUEST, str(e)
    except Exception as e:  # the server must answer, and say it was its own failure
        # an OSError's text names host paths (the session's directory): the client gets its
        # errno text only, the log the whole of it
        said = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        serving.log.error("%s %s failed: %s: %s", request.method, request.path, type(e).__name__, e)
        return web.json_response(
            {"error": f"{type(e).__name__}: {said}"}, status=HTTPStatus.INTERNAL_SERVER_ERROR
        )
    response = web.json_response({"error": message}, status=status)
    if status == HTTPStatus.REQUEST_TIMEOUT:
        response.force_close()  # the rest of a slow body would be read as the next request
    return response


class Server:
    """The executor server: ``serve_forever`` (blocking) until ``shutdown``, SIGTERM or SIGINT."""

    def __init__(
        self,
        factory: LocalFactory,
        config: ServerConfig,
        labels: dict[str, str | None] | None = None,
    ) -> None:
        self.config = config
        self.registry = Registry(factory, config.max_sessions, config.idle_timeout_s, labels)
        self.socket = socket.create_server(
            (config.host, config.port), backlog=config.listen_backlog
        )
        self.server_address = self.socket.getsockname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._done = threading.Event()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[_errors, auth.middleware(self.config.token)],
        )
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/sessions", self._create)
        app.router.add_delete("/v1/sessions/{sid}", self._close)
        app.router.add_route("*", "/v1/sessions/{sid}/{action}", self._action)
        return app

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(request.read(), self.config.body_timeout_s)
        except TimeoutError:
            raise HttpError(HTTPStatus.REQUEST_TIMEOUT, "request body too slow") from None
        if not raw:
            return {}
        body = json.loads(raw, parse_constant=_refuse_constant)
        if not isinstance(body, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return body

    async def _healthz(self, _: web.Request) -> web.Response:
        isolation = REPORTED[self.registry.factory.isolation]
        body = {"ok": True, "sessions": len(self.registry.sessions), "isolation": isolation}
        return web.json_response(body)

    async def _metrics(self, _: web.Request) -> web.Response:
        body = self.registry.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _create(self, request: web.Request) -> web.Response:
        body = CreateBody.model_validate(await self._json(request))
        return web.json_response({"id": await self.registry.create(body)})

    async def _close(self, request: web.Request) -> web.Response:
        await self.registry.close(request.match_info["sid"])
        return web.json_response({})

    async def _action(self, request: web.Request) -> web.Response:
        raw = await self._json(request)
        sid, action = request.match_info["sid"], request.match_info["action"]
        return web.json_response(await self.registry.call(sid, action, raw))

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.config.idle_timeout_s / 4))
            await self.registry.expire_idle()
            await self.registry.sweep()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._stop.set)
        # no handler_cancellation: a cancelled handler would free its session's lock while the
        # session's call still runs in the pool, and let a second call into the same session
        runner = serving.runner(self.app(), self.config.header_timeout_s)
        await runner.setup()
        cfg = self.config
        listening = await serving.listen(
            runner, self.socket, cfg.max_connections, cfg.listen_backlog
        )
        expiry = asyncio.create_task(self._expire_loop())
        try:
            await self._stop.wait()
        finally:
            expiry.cancel()
            listening.close()
            await runner.cleanup()
            await self._loop.run_in_executor(None, self.registry.close_all)

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread) and wait until it returned."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._done.wait()

    def server_close(self) -> None:
        self.socket.close()
        self.registry.pool.shutdown(wait=False)


def make_server(
    factory: LocalFactory,
    host: str,
    port: int,
    max_sessions: int = 64,
    labels: dict[str, str | None] | None = None,
    **options: Any,
) -> Server:
    """A bound ``Server`` (call ``serve_forever``); its registry is ``.registry``. ``labels``:
    ``run``/``pool`` of its metrics (default: from the environment)."""
    config = ServerConfig(host=host, port=port, max_sessions=max_sessions, **options)
    return Server(factory, config, labels)
