"""HTTP client of ``gagar sandbox serve``: the same ``Session`` protocol, remote.

``HttpFactory`` talks to one executor server; ``HttpPoolFactory`` spreads sessions over every
executor pod behind a headless Service (what the cluster trainer uses for ``sandbox.backend: pods``).

Transport failures during ``exec`` come back as an ``ExecResult`` with ``infra_error`` set (the
code did not fail; the infrastructure did); other calls raise ``SandboxInfraError`` for them and
``SandboxError`` for requests the server refused.
"""

from __future__ import annotations

import base64
import itertools
import socket
import threading
from collections.abc import Callable
from typing import Any, Self
from urllib.parse import urlsplit

import httpx

from gagar import auth
from gagar.sandbox.types import (
    Command,
    ExecResult,
    FileData,
    Limits,
    SandboxError,
    SandboxInfraError,
    SessionRequest,
    VerificationFactory,
)
from gagar.sandbox.workspace import files_tarball


def _call(client: httpx.Client, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
    try:
        resp = client.request(method, path, json=body)
    except httpx.HTTPError as e:
        raise SandboxInfraError(f"sandbox server unreachable: {e}") from e
    try:
        payload = resp.json()
    except ValueError:
        raise SandboxInfraError(f"sandbox server sent non-JSON ({resp.status_code})") from None
    if resp.status_code >= 500:
        raise SandboxInfraError(f"sandbox server error {resp.status_code}: {payload.get('error')}")
    if resp.status_code >= 400:
        raise SandboxError(payload.get("error", f"HTTP {resp.status_code}"))
    return payload


def _create_body(request: SessionRequest) -> dict[str, Any]:
    """``POST /v1/sessions``'s body (``server.CreateBody``) for ``request``."""
    body: dict[str, Any] = {}
    tarball = request.tarball
    if request.files is not None:
        try:
            body["files"] = {
                k: v if isinstance(v, str) else v.decode() for k, v in request.files.items()
            }
        except UnicodeDecodeError:  # binary content: JSON strings cannot carry it
            tarball = files_tarball(request.files)
    if tarball is not None:
        body["tarball_b64"] = base64.b64encode(tarball).decode()
    if request.verification:
        body |= {"verification": True, "preload": list(request.preload)}
    if request.limits is not None:
        body["limits"] = request.limits.model_dump()
    return body


class HttpFactory(VerificationFactory):
    """Creates sessions on an executor server at ``base_url``."""

    def __init__(self, base_url: str, timeout_s: float = 3600.0) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s, headers=auth.headers())

    @property
    def where(self) -> str:
        return f"the executor at {self.client.base_url}"

    def open(self, request: SessionRequest) -> HttpSession:
        """A session on the server: for a verification one of its stations (``station.py``)."""
        body = _create_body(request.for_one_image(self.where, None))  # None: the server's limits
        return HttpSession(self.client, _call(self.client, "POST", "/v1/sessions", body)["id"])

    def healthy(self) -> bool:
        try:
            return bool(_call(self.client, "GET", "/healthz").get("ok"))
        except SandboxError:
            return False

    def close(self) -> None:
        self.client.close()


def resolve_all(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a headless Service: one per ready pod), sorted."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise SandboxInfraError(f"cannot resolve sandbox executors {host!r}: {e}") from e
    return sorted({str(info[4][0]) for info in infos})


class HttpPoolFactory(VerificationFactory):
    """Sessions spread round-robin over every executor behind one name (a headless Service).

    A session lives on the pod that created it (its workspace is there), so a Service that load
    balances each request cannot front executors; a headless Service's name resolves to every
    ready pod instead. The name is resolved again for each session, as pods come and go.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 3600.0,
        resolve: Callable[[str, int], list[str]] = resolve_all,
        limits: Limits | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if not url.hostname:
            raise SandboxError(f"sandbox URL {base_url!r} has no host")
        self.scheme, self.host = url.scheme or "http", url.hostname
        self.port = url.port or (443 if self.scheme == "https" else 80)
        self.timeout_s, self._resolve = timeout_s, resolve
        self.limits = limits  # every session's, unless ``create`` names others (None: the pod's)
        self._factories: dict[str, HttpFactory] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def _pick(self) -> HttpFactory:
        addresses = self._resolve(self.host, self.port)
        if not addresses:
            raise SandboxInfraError(f"no sandbox executor behind {self.host!r}")
        with self._lock:
            addr = addresses[next(self._turn) % len(addresses)]
            if addr not in self._factories:
                host = f"[{addr}]" if ":" in addr else addr
                self._factories[addr] = HttpFactory(
                    f"{self.scheme}://{host}:{self.port}", self.timeout_s
                )
            return self._factories[addr]

    @property
    def where(self) -> str:
        return f"the executor pool {self.host}"

    def open(self, request: SessionRequest) -> HttpSession:
        return self._pick().open(request.for_one_image(self.where, self.limits))

    def close(self) -> None:
        with self._lock:
            for factory in self._factories.values():
                factory.close()
            self._factories.clear()


class HttpSession:
    """A session on an executor server. ``where``, where set, opens the text of every
    infrastructure failure (an agent-sandbox session's: which claim)."""

    def __init__(self, client: httpx.Client, sid: str, where: str = "") -> None:
        self.client, self.id, self.where = client, sid, where

    def _do(self, method: str, action: str, body: dict | None = None) -> dict[str, Any]:
        try:
            return _call(self.client, method, f"/v1/sessions/{self.id}/{action}", body)
        except SandboxInfraError as e:
            if not self.where:
                raise
            raise SandboxInfraError(f"{self.where}: {action}: {e}") from None

    def exec(self, cmd: Command, timeout: float | None = None) -> ExecResult:
        body = {"cmd": cmd if isinstance(cmd, str) else list(cmd), "timeout": timeout}
        try:
            reply = _call(self.client, "POST", f"/v1/sessions/{self.id}/exec", body)
            result = ExecResult.model_validate(reply)
        except SandboxInfraError as e:
            result = ExecResult(exit_code=None, infra_error=str(e))
        if result.infra_error is None or not self.where:
            return result
        return result.model_copy(update={"infra_error": f"{self.where}: {result.infra_error}"})

    def read_file(self, path: str) -> bytes:
        return base64.b64decode(self._do("POST", "read", {"path": path})["content_b64"])

    def write_file(self, path: str, data: FileData) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._do("POST", "write", {"path": path, "content_b64": base64.b64encode(raw).decode()})

    def delete_file(self, path: str) -> None:
        self._do("POST", "delete", {"path": path})

    def list_files(self) -> list[str]:
        return list(self._do("GET", "files")["files"])

    def diff(self) -> str:
        return str(self._do("GET", "diff")["diff"])

    def archive(self) -> bytes:
        return base64.b64decode(self._do("GET", "archive")["tarball_b64"])

    def reset(self) -> None:
        self._do("POST", "reset")

    def close(self) -> None:
        try:
            _call(self.client, "DELETE", f"/v1/sessions/{self.id}")
        except SandboxError:
            pass  # already gone (server restarted): nothing left to close

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
