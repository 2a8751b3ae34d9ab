"""A token on vLLM's control routes: weight updates, pause/resume and the dev-mode routes.

vLLM's ``--api-key`` guards only the OpenAI API (``/v1``, ...); with ``VLLM_SERVER_DEV_MODE=1``
(which the RL weight-update routes need) ``/update_weights``, ``/pause``, ``/collective_rpc``,
``/sleep`` and the rest answer whoever reaches the port. A NetworkPolicy fences the port to the
run's trainer, but only where the CNI enforces policies (not by default on EKS's VPC CNI or GKE
Standard without Dataplane V2). This ASGI middleware, loaded into vLLM's API server with
``--middleware gagar.rollout.engines.vllm_auth.ControlAuth``, refuses every such route without
``Authorization: Bearer <token>`` (401; a wrong token: 403), the token being
``$GAGAR_WEIGHT_SYNC_TOKEN``: a per-run Secret in the cluster (the operator makes it and hands it
to the trainer and the rollout pods), a random token per process locally (``control_token``).

Open without the token: the probes (``/health``, ``/ping``, ``/version``, ``/load``,
``/metrics``) and the OpenAI API prefixes, which vLLM's own ``--api-key`` decides. Everything
else needs it, so a route a newer vLLM adds is guarded too. A server started without the
variable refuses to start (a half-configured guard must not silently open the routes).

Not guarded against: a caller that holds the token (the trainer), and anyone who reads the
pods' environment (who could read the Secret anyway). Imports nothing from vLLM or starlette:
it is a plain ASGI class, testable without vLLM.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gagar import env

TOKEN_ENV = env.WEIGHT_SYNC_TOKEN
MIDDLEWARE = f"{__name__}.ControlAuth"  # the value of vLLM's --middleware
# readiness/liveness probes and load balancers; the OpenAI API is vLLM's --api-key's to decide
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/load", "/metrics"})
API_PREFIXES = ("/v1/", "/v2/", "/inference/", "/cohere/")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_local: str | None = None


def control_token() -> str:
    """The token of this process's vLLM servers and weight syncs: ``$GAGAR_WEIGHT_SYNC_TOKEN``
    (the run's Secret, in the cluster), else one random token drawn once per process, which the
    servers it starts (``VllmServer``) and the clients it makes (``ReplicaClient``) share."""
    global _local
    value = os.environ.get(TOKEN_ENV)
    if value:
        return value
    if _local is None:
        _local = secrets.token_urlsafe(32)
    return _local


def guarded(path: str) -> bool:
    """Whether ``path`` is a control route (needs the token)."""
    path = "/" + path.strip("/")
    return path not in OPEN_PATHS and not (path + "/").startswith(API_PREFIXES)


class ControlAuth:
    """ASGI middleware (vLLM adds a class with ``app.add_middleware``): 401 without a bearer
    token on a guarded route, 403 with a wrong one; compared in constant time."""

    def __init__(self, app: App, token: str | None = None) -> None:
        token = token or os.environ.get(TOKEN_ENV)
        if not token:
            raise RuntimeError(f"{TOKEN_ENV} is not set: vLLM's control routes would be open")
        self.app, self._want = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" and scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if scope.get("method") == "OPTIONS" or not guarded(path):
            return await self.app(scope, receive, send)
        code = self._check(scope)
        if code is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            await _refuse(send, code)
        return None

    def _check(self, scope: Scope) -> int | None:
        got = next((v for k, v in scope.get("headers") or () if k.lower() == b"authorization"), b"")
        scheme, _, value = bytes(got).partition(b" ")
        if scheme.lower() != b"bearer" or not value:
            return 401
        return None if hmac.compare_digest(value.strip(), self._want) else 403


async def _refuse(send: Send, code: int) -> None:
    what = "missing" if code == 401 else "wrong"
    body = json.dumps({"error": f"{what} weight-sync token ({TOKEN_ENV})"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if code == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
