"""Watch over HTTP: newline-delimited JSON events from a registered :class:`Watcher`.

``resourceVersion`` unset or ``0`` starts with synthetic ADDED events for the current objects
(and, with ``sendInitialEvents=true``, a BOOKMARK annotated ``k8s.io/initial-events-end``); a
version N replays the retained history after N, or answers an ERROR event with a 410 ``Expired``
Status when N is older than the history. ``allowWatchBookmarks=true`` adds a BOOKMARK every
``bookmark_interval`` seconds of silence, carrying the last version this stream has passed.
``timeoutSeconds`` ends the stream cleanly; ``KubeEmulator.drop_watches`` aborts it. An
``Accept`` asking for a Table (``kubectl get -w``) gets each event's object as a one-row Table,
the columns of a plain ``kubectl get``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from . import table as tables
from .errors import ApiError
from .resources import ResourceType
from .selectors import make_predicate
from .store import Store
from .watching import Watcher


async def serve_watch(
    store: Store, request: web.Request, t: Any, query: dict, bookmark_interval: float
) -> web.StreamResponse:
    """Stream one watch: replay, then live events, bookmarks, until timeout, drop or disconnect."""
    predicate = make_predicate(query.get("labelSelector"), query.get("fieldSelector"))
    if t.name:
        name_pred = make_predicate(None, f"metadata.name={t.name}")
        predicate = (lambda p, q: lambda o: p(o) and q(o))(predicate, name_pred)
    since = _since(query.get("resourceVersion"))
    watcher = Watcher(t.rt.storage_key, t.namespace, predicate, asyncio.get_running_loop())
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    try:
        last_rv = store.register_watcher(
            watcher, t.rt, since, query.get("sendInitialEvents") == "true"
        )
    except ApiError as e:
        await response.write(_line({"type": "ERROR", "object": e.status()}))
        return response
    if tables.wants_table(request.headers.get("Accept")):
        query = {**query, "as": "Table"}
    try:
        await _stream(request, response, watcher, t.rt, query, last_rv, bookmark_interval)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        store.unregister_watcher(watcher)
    return response


async def _stream(
    request: web.Request,
    response: web.StreamResponse,
    w: Watcher,
    rt: ResourceType,
    query: dict,
    last_rv: int,
    bookmark_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
    deadline = loop.time() + timeout if timeout is not None else None
    bookmarks = query.get("allowWatchBookmarks") == "true"
    while True:
        wait = (
            bookmark_interval
            if deadline is None
            else min(bookmark_interval, deadline - loop.time())
        )
        if wait <= 0:
            return
        try:
            kind, obj, rv = await asyncio.wait_for(w.queue.get(), wait)
        except TimeoutError:
            if bookmarks and (deadline is None or loop.time() < deadline):
                await response.write(_line(_bookmark(rt, last_rv)))
            continue
        if kind == "DROP":
            response.force_close()
            if request.transport is not None:
                request.transport.abort()  # abrupt, like a dropped connection
            return
        last_rv = max(last_rv, rv)
        if kind == "INITIAL-END":
            await response.write(_line(_bookmark(rt, last_rv, initial_end=True)))
        elif kind is not None:
            obj = {**obj, "apiVersion": rt.api_version, "kind": rt.kind}
            if query.get("as") == "Table":
                meta = {"resourceVersion": str(rv)}
                obj = tables.table(rt, [obj], meta, query.get("includeObject"))
            await response.write(_line({"type": kind, "object": obj}))


def _line(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> dict:
    meta: dict = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {
        "type": "BOOKMARK",
        "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta},
    }


def _since(value: str | None) -> int | None:
    if value in (None, "", "0"):
        return None
    if not value.isdigit():
        raise ApiError(400, f"invalid resource version {value!r}")
    return int(value)
