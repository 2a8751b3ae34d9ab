"""What gagar's aiohttp services (``gagar sandbox serve``, ``gagar grader serve``) share against
slow, idle, numerous or broken clients.

aiohttp does most of it and is only configured here: ``keepalive_timeout`` closes a connection
that has not finished sending a request's headers within that time of opening, or of the last
answer on it (so a client sending headers a byte at a time and an idle keep-alive connection
are both closed: aiohttp arms that timer at ``connection_made``); ``client_max_size`` caps a
body; the parser's ``max_line_size``/``max_field_size``/``max_headers`` cap the headers. What
aiohttp lacks is written here:

- ``read_body``: the whole body within ``body_timeout_s`` (408, and the connection is closed: the
  rest of a slow body would otherwise be read as the next request);
- ``listen``: a cap on open connections; past it a connection is answered 503 and closed at once
  (it costs a descriptor for microseconds, not until a timeout);
- ``errors``: the outermost middleware; a failure of the service is one log line (no traceback)
  and a JSON 500, an aiohttp refusal (404, 413, ...) its JSON ``{"error"}``.

Not protected against here: a client that sends its request in time and then reads the answer
slowly (the kernel's send buffer and the handler's own timeouts bound that), and a flood of new
connections faster than they can be refused (the listen backlog and the network are the limit).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 512
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 35\r\nConnection: close\r\n\r\n"
    b'{"error": "too many connections"}\r\n'
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def runner(app: web.Application, header_timeout_s: float, **options: Any) -> web.AppRunner:
    """An ``AppRunner`` whose connections must deliver each request's headers (and stay idle at
    most) ``header_timeout_s``; ``options`` go to aiohttp (``handler_cancellation``, ...)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=header_timeout_s, **options)


class _Busy(asyncio.Protocol):
    """What a connection past the cap gets: a 503 and the door."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(BUSY)
        transport.close()


async def listen(
    app_runner: web.AppRunner, sock: socket.socket, max_connections: int, backlog: int = 128
) -> asyncio.AbstractServer:
    """Serve ``app_runner`` (set up) on ``sock`` with at most ``max_connections`` open at once.
    Close the returned server before ``app_runner.cleanup()``."""
    server = app_runner.server
    assert server is not None, "call app_runner.setup() first"
    loop = asyncio.get_running_loop()
    accepting = 0  # handlers made whose connection_made has not registered them yet

    def registered() -> None:
        nonlocal accepting
        accepting -= 1

    def protocol() -> asyncio.BaseProtocol:
        nonlocal accepting
        if len(server.connections) + accepting >= max_connections:
            return _Busy()
        accepting += 1
        # queued just before the transport queues the handler's connection_made (which adds
        # it to server.connections): between the two nothing runs, so the count never dips
        loop.call_soon(registered)
        return server()

    return await loop.create_server(protocol, sock=sock, backlog=backlog)


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The request's body, or 408 when it did not arrive within ``timeout_s``."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except TimeoutError:
        raise web.HTTPRequestTimeout(reason="request body too slow") from None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as ``{"error"}`` JSON; the service's own failure as one log line and a 500."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        kept = {k: v for k, v in e.headers.items() if k not in ("Content-Type", "Content-Length")}
        response = web.json_response({"error": e.reason}, status=e.status, headers=kept)
        if e.status == web.HTTPRequestTimeout.status_code:
            response.force_close()
        return response
    except Exception as e:  # the service must answer, and say it was its own failure
        log.error("%s %s failed: %s: %s", request.method, request.path, type(e).__name__, e)
        return web.json_response({"error": f"internal error: {type(e).__name__}"}, status=500)
