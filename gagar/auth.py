"""Optional shared-token authentication between gagar's services and their callers.

When ``GAGAR_AUTH_TOKEN_FILE`` names a file (a Kubernetes Secret mounted in the pods), the
sandbox executor and the grader service refuse every request without ``Authorization: Bearer
<token>`` (401), except ``/healthz`` and ``/metrics`` (probes and scrapers), and the clients
(trainer, grader) send it. Without the variable, nothing changes: the services rely on listening
on 127.0.0.1 or on the pods' NetworkPolicies. The token is compared as bytes, in constant time: a
header that is not UTF-8 (aiohttp keeps its raw bytes as surrogate escapes) is simply wrong, 401.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from gagar.env import AUTH_TOKEN_FILE as TOKEN_FILE_ENV

OPEN_PATHS = frozenset({"/healthz", "/metrics"})


def token() -> str | None:
    """The shared token, or None when authentication is off; an unreadable or empty file is an
    error (a half-configured secret must not silently turn authentication off)."""
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        value = Path(path).read_text().strip()
    except OSError as e:
        raise RuntimeError(f"{TOKEN_FILE_ENV}={path}: cannot read the token: {e.strerror}") from e
    if not value:
        raise RuntimeError(f"{TOKEN_FILE_ENV}={path}: the token file is empty")
    return value


def headers(value: str | None = None) -> dict[str, str]:
    """The request headers that carry the token (empty when authentication is off)."""
    value = value if value is not None else token()
    return {"Authorization": f"Bearer {value}"} if value else {}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(expected: str | None) -> Middleware:
    """aiohttp middleware: 401 unless the request carries ``expected`` (pass-through if None)."""
    want = f"Bearer {expected}".encode() if expected else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if want is not None and request.path not in OPEN_PATHS:
            # surrogateescape gives back the bytes the client sent, whatever they are
            got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(got, want):
                return web.json_response({"error": "missing or wrong token"}, status=401)
        return await handler(request)

    return check
