"""The HTTP surface: aiohttp handlers mapping Kubernetes REST paths onto the store.

Paths: ``/api``, ``/apis``, ``/api/v1``, ``/apis/{group}[/{version}]`` (discovery), ``/version``,
``/healthz``/``/livez``/``/readyz``, ``/openapi/v3[/{group-version}]`` (:mod:`.openapi`), and
the resource paths ``/api/v1[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]`` and the same
under ``/apis/{group}/{version}``, ``pods/{name}/log`` among them (a text saying that no process
runs). Writes take ``fieldManager`` from the query or, like the server, from the User-Agent's
product name, and ``fieldValidation`` (Strict: 400 naming the unknown fields, Warn: a
``Warning`` header, Ignore). Answers are JSON: an ``Accept`` listing protobuf before JSON gets
JSON, one without JSON 406. Bodies are JSON (YAML for apply), or protobuf for the kinds
:mod:`.protobuf` reads (415 for any other).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import yaml
from aiohttp import web

from . import clients, openapi, patching, protobuf, ssa
from . import table as tables
from .errors import ApiError
from .faults import Faults
from .rbac import Attributes, Authorizer, Identity
from .resources import ResourceType, api_group_list, api_resource_list
from .scale import read_scale, write_scale
from .selectors import SelectorError, make_predicate
from .store import Store, WriteOptions
from .watch_http import serve_watch

log = logging.getLogger(__name__)
VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-gagar-emulator",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.22",
    "compiler": "gc",
    "platform": "linux/amd64",
}
PATCH_TYPES = {
    "application/merge-patch+json": patching.merge_patch,
    "application/strategic-merge-patch+json": patching.strategic_merge_patch,
    "application/json-patch+json": patching.json_patch,
}
APPLY_TYPE = "application/apply-patch+yaml"
WHO = web.RequestKey("who", Identity)
FIELD_WARNINGS = web.RequestKey("field_warnings", list)


@dataclass
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str


def _json(body: dict, code: int = 200) -> web.Response:
    return web.json_response(body, status=code)


class Server:
    def __init__(self, store: Store, faults: Faults, bookmark_interval: float = 1.0) -> None:
        self.store = store
        self.faults = faults
        self.bookmark_interval = bookmark_interval
        self.requests: list[dict] = []
        self.authorizer = Authorizer(store)
        self.openapi = openapi.Documents()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # ----- entry -----------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(parse_qsl(request.query_string, keep_blank_values=True))
        record = {
            "method": request.method,
            "path": request.path,
            "query": query,
            "content_type": request.content_type,
            "verb": None,
            "code": None,
        }
        self.requests.append(record)
        try:
            self.store.begin_request(query.get("fieldValidation"), query.get("dryRun"))
            request[FIELD_WARNINGS] = []
            response = await self._route(request, query, record)
            warnings = self.store.take_warnings() + request[FIELD_WARNINGS]
            if warnings:
                response.headers["Warning"] = ", ".join(
                    '299 - "{}"'.format(w.replace('"', '\\"')) for w in warnings
                )
        except ApiError as e:
            response = _json(e.status(), e.code)
        except patching.PatchError as e:
            response = _json(ApiError(e.code, str(e)).status(), e.code)
        except (SelectorError, json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as e:
            response = _json(ApiError(400, str(e)).status(), 400)
        except Exception as e:  # a bug in the emulator: report it as the server would
            log.exception("emulator failure on %s %s", request.method, request.path)
            response = _json(ApiError(500, f"emulator error: {e!r}").status(), 500)
        record["code"] = response.status
        return response

    async def _route(self, request: web.Request, query: dict, record: dict) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        who = self.authorizer.identify(request.headers.get("Authorization"))
        record["user"] = who.user
        if _non_resource(path):  # authorized before it is routed, as the server does
            self.authorizer.check_path(who, path)
        static = self._static(path)
        if static is not None:
            record["verb"] = "get"
            return static
        target = self._parse(path)
        verb = _verb(request.method, target, query)
        record["verb"] = verb
        self._authorize(who, verb, target)
        clients.negotiate(request.headers.get("Accept", ""), target.sub)
        request[WHO] = who  # the escalation check of a Role this request writes
        for rule in self.faults.take(verb, request.path):
            if rule.action == "latency":
                await asyncio.sleep(rule.delay)
            elif rule.action == "conflict":
                raise ApiError(
                    409,
                    "injected conflict: the object has been modified; please apply your changes to the latest version and try again",
                    "Conflict",
                )
            else:
                raise ApiError(rule.code, rule.message)
        handler = getattr(self, f"_{verb}")
        return await handler(request, target, query)

    def _authorize(self, who: Identity, verb: str, t: Target) -> None:
        resource = f"{t.rt.plural}/{t.sub}" if t.sub else t.rt.plural
        self.authorizer.check(who, Attributes(verb, t.rt.group, resource, t.namespace, t.name))

    def _check_grant(self, request: web.Request, t: Target, body: dict) -> None:
        self.authorizer.check_escalation(request[WHO], t.rt, t.namespace, body)

    def _static(self, path: str) -> web.Response | None:
        types = list(self.store.types.values())
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path.startswith("/openapi/"):
            return self._openapi(path, types)
        if path == "/version":
            return _json(VERSION)
        if path == "/api":
            return _json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
                    ],
                }
            )
        if path == "/apis":
            return _json(api_group_list(types))
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            return self._resource_list("", parts[1], types)
        if parts[0] == "apis" and len(parts) == 2:
            groups = [g for g in api_group_list(types)["groups"] if g["name"] == parts[1]]
            if not groups:
                raise ApiError(
                    404, f"the server could not find the requested resource (group {parts[1]})"
                )
            return _json({"kind": "APIGroup", "apiVersion": "v1", **groups[0]})
        if parts[0] == "apis" and len(parts) == 3:
            return self._resource_list(parts[1], parts[2], types)
        return None

    def _openapi(self, path: str, types: list[ResourceType]) -> web.Response:
        """``/openapi/v3`` and its group-version documents (no ``/openapi/v2``: see openapi.py)."""
        if path == "/openapi/v3":
            return _json(self.openapi.discovery(types))
        for group, version in openapi.group_versions(types):
            if path == f"/openapi/v3/{openapi.gv_path(group, version)}":
                return _json(self.openapi.get(group, version, types)[0])
        raise ApiError(404, f"the server could not find the requested resource ({path})")

    def _resource_list(self, group: str, version: str, types: list[ResourceType]) -> web.Response:
        matching = [t for t in types if (t.group, t.version) == (group, version)]
        if not matching:
            raise ApiError(
                404, f"the server could not find the requested resource ({group}/{version})"
            )
        listing = api_resource_list(f"{group}/{version}" if group else version, matching)
        categories = self._categories()
        for resource in listing["resources"]:
            found = categories.get((group, resource["name"]))
            if found:
                resource["categories"] = found
        return _json(listing)

    def _categories(self) -> dict[tuple[str, str], list[str]]:
        crds = self.store.objects.get(("apiextensions.k8s.io", "customresourcedefinitions"), {})
        with self.store.lock:
            stored = list(crds.values())
        return clients.categories(stored)

    def _parse(self, path: str) -> Target:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        ns = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        rt = self.store.type_for(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub == "finalize" and rt.plural == "namespaces":
            sub = ""
        if (ns is not None and not rt.namespaced) or (rt.namespaced and ns is None and name):
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if sub and sub not in rt.subresources and (sub, rt.plural) != ("log", "pods"):
            raise ApiError(
                404, f"the server could not find the requested resource ({rt.plural}/{sub})"
            )
        return Target(rt, ns, name, sub)

    # ----- reads -----------------------------------------------------------------------------

    async def _get(self, request: web.Request, t: Target, query: dict) -> web.Response:
        obj = self.store.get(t.rt, t.namespace, t.name)
        if t.sub == "log":
            return web.Response(text=clients.pod_log(obj, query.get("container")))
        if not t.sub and tables.wants_table(request.headers.get("Accept")):
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return _json(tables.table(t.rt, [obj], meta, query.get("includeObject")))
        return _json(read_scale(t.rt, obj) if t.sub == "scale" else obj)

    async def _list(self, request: web.Request, t: Target, query: dict) -> web.Response:
        predicate = make_predicate(query.get("labelSelector"), query.get("fieldSelector"))
        exact = _exact_version(query)
        if exact is None:
            items, rv = self.store.list(t.rt, t.namespace, predicate)
        else:
            items, rv = self.store.list_at(t.rt, t.namespace, predicate, exact)
        start = 0
        if query.get("continue"):
            after = base64.urlsafe_b64decode(query["continue"].encode()).decode()
            start = next((i for i, o in enumerate(items) if _key(o) > after), len(items))
        limit = int(query.get("limit") or 0) or len(items)
        page = items[start : start + limit]
        meta: dict = {"resourceVersion": str(rv)}
        if start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(_key(page[-1]).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        if tables.wants_table(request.headers.get("Accept")):
            return _json(tables.table(t.rt, page, meta, query.get("includeObject")))
        return _json(
            {
                "kind": f"{t.rt.kind}List",
                "apiVersion": t.rt.api_version,
                "metadata": meta,
                "items": page,
            }
        )

    # ----- writes ----------------------------------------------------------------------------

    async def _create(self, request: web.Request, t: Target, query: dict) -> web.Response:
        body = await clients.body(request, t.rt)
        _check_kind(t.rt, body)
        self._check_fields(request, t, body, query)
        self._check_grant(request, t, body)
        obj = self.store.create(t.rt, t.namespace, body, _manager(request, query))
        return _json(obj, 201)

    async def _update(self, request: web.Request, t: Target, query: dict) -> web.Response:
        body = await clients.body(request, t.rt)
        if t.sub == "scale":
            return _json(write_scale(self.store, t, lambda _: body, _manager(request, query)))
        _check_kind(t.rt, body)
        self._check_fields(request, t, body, query)
        self._check_grant(request, t, {**body, "metadata": {"name": t.name}})
        if (body.get("metadata") or {}).get("name") not in (None, t.name):
            raise ApiError(400, "the name of the object does not match the name on the URL")
        how = WriteOptions(_manager(request, query), t.sub)
        return _json(self.store.write(t.rt, t.namespace, t.name, lambda _: body, how))

    async def _patch(self, request: web.Request, t: Target, query: dict) -> web.Response:
        ctype = request.content_type
        if ctype == APPLY_TYPE:
            return await self._apply(request, t, query)
        if ctype not in PATCH_TYPES:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: {', '.join([*PATCH_TYPES, APPLY_TYPE])}",
            )
        if t.rt.custom and ctype == "application/strategic-merge-patch+json":
            raise ApiError(415, "strategic merge patch is not supported for custom resources")
        patch, algorithm = await request.json(), PATCH_TYPES[ctype]
        if ctype != "application/json-patch+json":  # a JSON patch is a list of operations
            self._check_fields(request, t, patch, query)
        manager = _manager(request, query)
        if t.sub == "scale":
            return _json(write_scale(self.store, t, lambda scale: algorithm(scale, patch), manager))
        how = WriteOptions(manager, t.sub)
        return _json(
            self.store.write(t.rt, t.namespace, t.name, lambda o: algorithm(o, patch), how)
        )

    async def _apply(self, request: web.Request, t: Target, query: dict) -> web.Response:
        applied = _yaml_or_json(await request.text())
        manager = query.get("fieldManager")
        if not manager:
            raise ApiError(
                400, "PATCH, application/apply-patch+yaml requires fieldManager to be set"
            )
        if not isinstance(applied, dict):
            raise ApiError(400, "the applied configuration must be an object")
        _check_kind(t.rt, applied, required=True)
        self._check_fields(request, t, applied, query)
        duplicates = [] if t.rt.custom else ssa.duplicate_keys(applied)
        if duplicates:
            raise ApiError(422, "failed to create typed patch object: " + "; ".join(duplicates),
                           "Invalid")  # fmt: skip
        if (applied.get("metadata") or {}).get("name") not in (None, t.name):
            raise ApiError(400, "the name of the object does not match the name on the URL")
        applied.setdefault("metadata", {})["name"] = t.name
        self._check_grant(request, t, applied)
        scoped = _apply_scope(t.rt, applied, t.sub)
        key = (manager, "Apply", t.sub)
        with self.store.lock:
            try:
                self.store.get(t.rt, t.namespace, t.name)
            except ApiError:
                if t.sub:
                    raise
                return _json(self._apply_create(t, scoped, key), 201)
            how = WriteOptions(manager, t.sub)

            def mutate(current: dict) -> dict:
                result, how.entries = ssa.apply(current, scoped, key, query.get("force") == "true")
                return result

            try:
                return _json(self.store.write(t.rt, t.namespace, t.name, mutate, how))
            except ssa.ApplyConflict as e:
                causes = [
                    {
                        "type": "FieldManagerConflict",
                        "message": f'conflict with "{m}"',
                        "field": "." + ".".join(p),
                    }
                    for p, m in e.conflicts
                ]
                raise ApiError(
                    409,
                    e.message(),
                    "Conflict",
                    {"name": t.name, "group": t.rt.group, "kind": t.rt.plural, "causes": causes},
                ) from e

    def _apply_create(self, t: Target, applied: dict, key: ssa.EntryKey) -> dict:
        return self.store.create(t.rt, t.namespace, applied, key[0], operation="Apply")

    def _check_fields(self, request: web.Request, t: Target, body: Any, query: dict) -> None:
        """Unknown fields as ``fieldValidation`` asks (unset: Warn): Strict refuses them as the
        server's strict decoding does (400), Warn names them in a ``Warning`` header. A custom
        kind's Warn and Ignore are admission's (it prunes them); a built-in kind keeps them."""
        if t.sub == "scale":
            return
        mode = query.get("fieldValidation") or ("Strict" if self.store.strict_fields else "Warn")
        if mode == "Ignore" or (mode == "Warn" and t.rt.custom):
            return
        unknown = [f'unknown field "{p}"' for p in openapi.unknown_fields(t.rt, body)]
        if unknown and mode == "Strict":
            kind, version = t.rt.kind, t.rt.version
            raise ApiError(
                400,
                f'{kind} in version "{version}" cannot be handled as a {kind}: '
                f"strict decoding error: {', '.join(unknown)}",
            )
        request[FIELD_WARNINGS].extend(unknown)

    async def _delete(self, request: web.Request, t: Target, query: dict) -> web.Response:
        options = await _delete_options(request, query)
        if options.get("dryRun"):
            self.store.begin_request(query.get("fieldValidation"), "All")
        return _json(self.store.delete(t.rt, t.namespace, t.name, options))

    async def _deletecollection(self, request: web.Request, t: Target, query: dict) -> web.Response:
        options = await _delete_options(request, query)
        if options.get("dryRun"):
            self.store.begin_request(query.get("fieldValidation"), "All")
        predicate = make_predicate(query.get("labelSelector"), query.get("fieldSelector"))
        items, _ = self.store.list(t.rt, t.namespace, predicate)
        deleted = [
            self.store.delete(t.rt, o["metadata"].get("namespace"), o["metadata"]["name"], options)
            for o in items
        ]
        return _json(
            {
                "kind": f"{t.rt.kind}List",
                "apiVersion": t.rt.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": deleted,
            }
        )

    async def _watch(self, request: web.Request, t: Target, query: dict) -> web.StreamResponse:
        return await serve_watch(self.store, request, t, query, self.bookmark_interval)


def _key(obj: dict) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _yaml_or_json(text: str) -> Any:
    """An apply body: JSON (a client's usual) read as JSON, where ``1e-06`` is a number (PyYAML's
    YAML 1.1 reads it as a string; the server's YAML reader takes it as JSON does), else YAML."""
    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text)


def _verb(method: str, t: Target, query: dict) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if t.name else "list"
    verbs = {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if t.name else "deletecollection",
    }
    if (
        method not in verbs
        or (method in ("PUT", "PATCH") and not t.name)
        or (method == "POST" and t.name)
    ):
        raise ApiError(
            405, f"the server does not allow this method on the requested resource ({method})"
        )
    return verbs[method]


def _manager(request: web.Request, query: dict) -> str:
    if query.get("fieldManager"):
        return query["fieldManager"]
    agent = request.headers.get("User-Agent", "unknown")
    return agent.split("/")[0].strip() or "unknown"


def _check_kind(rt: ResourceType, body: dict, required: bool = False) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if required and (not api_version or not kind):
        raise ApiError(400, "apiVersion and kind must be set in an applied configuration")
    if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
        raise ApiError(
            400,
            f"the object provided ({api_version}, {kind}) does not match the resource ({rt.api_version}, {rt.kind})",
        )


def _apply_scope(rt: ResourceType, applied: dict, sub: str) -> dict:
    """An apply to the main resource never touches status; one to /status touches only status."""
    if sub == "status":
        keep = {k: applied[k] for k in ("apiVersion", "kind", "status") if k in applied}
        return {**keep, "metadata": {"name": applied["metadata"]["name"]}}
    return {k: v for k, v in applied.items() if k != "status"} if rt.status else applied


async def _delete_options(request: web.Request, query: dict) -> dict:
    options = {}
    if request.can_read_body and request.content_type == clients.PROTOBUF:  # typed clients' deletes
        try:
            options = protobuf.decode(await request.read())
        except protobuf.ProtobufError as e:
            raise ApiError(400, f"the DeleteOptions could not be read: {e}") from e
    elif request.can_read_body:
        text = await request.text()
        options = json.loads(text) if text.strip() else {}
    if query.get("propagationPolicy"):
        options["propagationPolicy"] = query["propagationPolicy"]
    dry = options.get("dryRun") or []  # DeleteOptions carry it in the body (kubectl does)
    if dry and dry != ["All"]:
        raise ApiError(400, f"Invalid dryRun value: {dry!r}: supported values: All")
    return options


def _non_resource(path: str) -> bool:
    """A path that names no resource: discovery (``/api``, ``/apis/<group>[/<version>]``), the
    version and the health checks."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        return len(parts) <= 2
    if parts[0] == "openapi":
        return True
    return (parts[0] == "apis" and len(parts) <= 3) or path in NON_RESOURCE


NON_RESOURCE = ("/", "/version", "/healthz", "/livez", "/readyz")


def _exact_version(query: dict) -> int | None:
    """The version of ``resourceVersionMatch=Exact`` (None for any other list), refused as the
    server refuses it: a match without a version, or an exact "0"."""
    match, rv = query.get("resourceVersionMatch"), query.get("resourceVersion")
    if not match:
        return None
    if not rv:
        raise ApiError(400, "resourceVersionMatch is forbidden unless resourceVersion is provided")
    if match == "NotOlderThan":
        return None
    if match != "Exact":
        raise ApiError(400, f'resourceVersionMatch "{match}" is not supported')
    if rv == "0":
        raise ApiError(400, 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
    if not rv.isdigit():
        raise ApiError(400, f'invalid resource version "{rv}"')
    return int(rv)
