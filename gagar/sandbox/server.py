"""``gagar sandbox serve``: local sessions over HTTP, for executor servers in sandbox pods.

JSON over HTTP (stdlib ``ThreadingHTTPServer``: one thread per request, commands block):

=======  ==============================  ==============================================
POST     /v1/sessions                    ``{files?, tarball_b64?, limits?}`` → ``{id}``
POST     /v1/sessions/{id}/exec          ``{cmd, timeout?}`` → ``ExecResult``
POST     /v1/sessions/{id}/read          ``{path}`` → ``{content_b64}``
POST     /v1/sessions/{id}/write         ``{path, content_b64}``
POST     /v1/sessions/{id}/delete        ``{path}``
GET      /v1/sessions/{id}/files         → ``{files}``
GET      /v1/sessions/{id}/diff          → ``{diff}`` (unified diff against the base)
GET      /v1/sessions/{id}/archive       → ``{tarball_b64}``
POST     /v1/sessions/{id}/reset
DELETE   /v1/sessions/{id}
GET      /healthz
GET      /metrics                        Prometheus text format
=======  ==============================  ==============================================

Metrics: the catalogue's ``gagar_sandbox_*`` series, labelled with the server's run and pool
(``gagar.sandbox.metrics``).

A refused request (bad path, unknown session, invalid body) is 400/404 with ``{"error"}``; a full
server is 503. The server has no authentication: it must only be reachable by its trainer
(the pod's NetworkPolicy), like any executor in a sandbox pool.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gagar.sandbox.local import LocalFactory, LocalSession
from gagar.sandbox.metrics import CONTENT_TYPE_LATEST, SandboxMetrics
from gagar.sandbox.types import Limits, SandboxError

MAX_BODY = 256 << 20


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateBody(_Body):
    files: dict[str, str] | None = None
    tarball_b64: str | None = None
    limits: Limits | None = None


class ExecBody(_Body):
    cmd: str | list[str]
    timeout: float | None = None


class PathBody(_Body):
    path: str


class WriteBody(_Body):
    path: str
    content_b64: str


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Registry:
    """Live sessions by id, each with a lock: one request at a time per session."""

    def __init__(
        self, factory: LocalFactory, max_sessions: int, labels: dict[str, str] | None = None
    ) -> None:
        self.factory, self.max_sessions = factory, max_sessions
        self.sessions: dict[str, tuple[LocalSession, threading.Lock]] = {}
        self.lock = threading.Lock()
        self.metrics = SandboxMetrics(lambda: len(self.sessions), max_sessions, **(labels or {}))

    def create(self, body: CreateBody) -> str:
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "too many sessions")
        tar = base64.b64decode(body.tarball_b64) if body.tarball_b64 else None
        session = self.factory.create(files=body.files, tarball=tar, limits=body.limits)
        sid = uuid.uuid4().hex
        with self.lock:
            self.sessions[sid] = (session, threading.Lock())
        return sid

    def get(self, sid: str) -> tuple[LocalSession, threading.Lock]:
        with self.lock:
            if sid not in self.sessions:
                raise HttpError(HTTPStatus.NOT_FOUND, f"unknown session {sid}")
            return self.sessions[sid]

    def close(self, sid: str) -> None:
        session, lock = self.get(sid)
        with lock:
            session.close()
        with self.lock:
            self.sessions.pop(sid, None)

    def close_all(self) -> None:
        for sid in list(self.sessions):
            self.close(sid)


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


class Handler(BaseHTTPRequestHandler):
    registry: Registry  # set on the subclass made by ``make_server``
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/metrics":
            body = self.registry.metrics.exposition()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        try:
            status, payload = HTTPStatus.OK, self._route(method, self._read_json())
        except HttpError as e:
            status, payload = e.status, {"error": str(e)}
        except ValidationError as e:
            status, payload = HTTPStatus.BAD_REQUEST, {"error": f"invalid request: {e}"}
        except (SandboxError, ValueError) as e:
            status, payload = HTTPStatus.BAD_REQUEST, {"error": str(e)}
        except Exception as e:  # the server must answer, and say it was its own failure
            status, payload = (
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"{type(e).__name__}: {e}"},
            )
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
        if not length:
            return {}
        raw = json.loads(self.rfile.read(length))
        if not isinstance(raw, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        return raw

    def _route(self, method: str, raw: dict[str, Any]) -> dict[str, Any]:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if parts == ["healthz"]:
            return {"ok": True, "sessions": len(self.registry.sessions)}
        if parts == ["v1", "sessions"] and method == "POST":
            return {"id": self.registry.create(CreateBody.model_validate(raw))}
        if len(parts) == 3 and parts[:2] == ["v1", "sessions"] and method == "DELETE":
            self.registry.close(parts[2])
            return {}
        if len(parts) == 4 and parts[:2] == ["v1", "sessions"]:
            session, lock = self.registry.get(parts[2])
            with lock:
                return _session_call(session, parts[3], raw, self.registry.metrics)
        raise HttpError(HTTPStatus.NOT_FOUND, f"no route {method} {self.path}")


def make_server(
    factory: LocalFactory,
    host: str,
    port: int,
    max_sessions: int = 64,
    labels: dict[str, str] | None = None,
):
    """A ready ``ThreadingHTTPServer`` (call ``serve_forever``); its registry is ``.registry``.
    ``labels``: ``run``/``pool`` of its metrics (default: from the environment)."""
    registry = Registry(factory, max_sessions, labels)
    handler = type("BoundHandler", (Handler,), {"registry": registry})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.registry = registry  # type: ignore[attr-defined]
    return server
