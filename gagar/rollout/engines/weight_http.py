"""Published policy versions over HTTP: the trainer serves them, rollout replicas fetch them.

In a cluster the rollout pool reads the trainer's weights through the trainer instead of through a
shared volume, so the checkpoint volume needs no ReadWriteMany (a default StorageClass offers
ReadWriteOnce only) and the replicas need no placement beside the trainer. Rank 0 serves the
folder ``weight_sync.publish_version`` writes (``<root>/v<N>/``, ``<root>/latest``):

=================================  ===============================================================
``GET /versions/latest``           ``{"version": N, "files": {name: size}}`` of the newest version
``GET /versions/<N>``              the same for version N
``GET /versions/<N>/<file>``       one file of it, streamed from disk
``GET /healthz``                   open: probes
=================================  ===============================================================

A new replica boots from ``latest`` (``fetch_version``, the pod's init container ``gagar rollout
fetch-weights``); each weight update makes the replica's vLLM workers fetch the version's
safetensors (``download``) and load it (``vllm_plugin``).

What it guards: every route but ``/healthz`` takes only the run's weight-sync token (the Secret
the operator makes, ``vllm_auth.TOKEN_ENV``: 401 without one, 403 with a wrong one); it serves
only complete versions (a folder renamed into place with its ``gagar-version.json``: a temporary
folder or a half-written one is invisible), and only the plain files listed in one (no path from
the request reaches the file system: a name is looked up in the folder's listing, so ``..``, an
encoded slash or a symbolic link get a 404); reads are read-only. Not guarded against: a caller
with the token (the rollout pods), who may read every published version.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from gagar.rollout.engines.weight_sync import VERSION_FILE

log = logging.getLogger(__name__)

_VERSION = re.compile(r"v(\d+)")
CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A version could not be fetched; ``status`` is the HTTP status when the server answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NothingPublished(FetchError):
    """The trainer answers but has published no version yet."""


# ---------------------------------------------------------------- the trainer's side


def listing(root: Path, version: int) -> dict[str, int] | None:
    """``{file: size}`` of a complete version under ``root``; None when absent or incomplete."""
    folder = root / f"v{version}"
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return None
    files = {
        e.name: e.stat(follow_symlinks=False).st_size
        for e in entries
        if e.is_file(follow_symlinks=False) and not e.name.startswith(".")
    }
    return files if VERSION_FILE in files else None


def latest_version(root: Path) -> int | None:
    """The version ``root/latest`` points at, if it is complete."""
    try:
        target = os.readlink(root / "latest")
    except OSError:
        return None
    m = _VERSION.fullmatch(target)
    if m is None or listing(root, int(m[1])) is None:
        return None
    return int(m[1])


def _auth(token: str) -> Any:
    """Middleware: every route but ``/healthz`` takes ``Authorization: Bearer <token>``."""
    want = token.encode()

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(value.strip().encode(), want):
            raise web.HTTPForbidden()
        return await handler(request)

    return auth


def _version(root: Path, raw: str) -> tuple[int, dict[str, int]]:
    """(number, listing) of the complete version the request names (``latest`` or a number)."""
    number = latest_version(root) if raw == "latest" else int(raw) if raw.isdigit() else None
    files = None if number is None else listing(root, number)
    if number is None or files is None:
        raise web.HTTPNotFound(reason="no such version published")  # nothing of the request echoed
    return number, files


def make_app(root: Path, token: str) -> web.Application:
    """The aiohttp application serving ``root``'s published versions to holders of ``token``."""

    async def describe(request: web.Request) -> web.StreamResponse:
        number, files = _version(root, request.match_info["version"])
        return web.json_response({"version": number, "files": files})

    async def file(request: web.Request) -> web.StreamResponse:
        number, files = _version(root, request.match_info["version"])
        name = request.match_info["name"]
        if name not in files:  # a name from the folder's listing, never a path from the request
            raise web.HTTPNotFound()
        return web.FileResponse(root / f"v{number}" / name, chunk_size=CHUNK)

    async def health(_: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[_auth(token)])
    app.router.add_get("/healthz", health)
    app.router.add_get("/versions/{version}", describe)
    app.router.add_get("/versions/{version}/{name}", file)
    return app


class WeightServer:
    """``make_app`` served on its own event loop in a daemon thread (the trainer is synchronous
    around it); ``close()`` stops it."""

    def __init__(self, root: Path, token: str, host: str = "0.0.0.0", port: int = 0) -> None:
        if not token:
            raise ValueError("the weight server needs the run's weight-sync token")
        self.root, self.token, self.host = Path(root), token, host
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(port), self.loop)
        self.port: int = future.result(30)

    async def _start(self, port: int) -> int:
        if self.host == "0.0.0.0" and socket.has_dualstack_ipv6():  # IPv6-only clusters too
            sock = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            sock = socket.create_server((self.host, port))
        self._runner = web.AppRunner(make_app(self.root, self.token), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return int(sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        if not self.loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


# ---------------------------------------------------------------- the replica's side


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _check(r: httpx.Response, what: str) -> None:
    if r.status_code in (401, 403):
        raise FetchError(
            f"{what} -> {r.status_code}: the trainer refused the weight-sync token", r.status_code
        )
    if r.status_code >= 400:
        raise FetchError(f"{what} -> {r.status_code}", r.status_code)


def manifest(base_url: str, token: str, version: str = "latest", timeout: float = 30) -> dict:
    """``{"version", "files"}`` of a published version; ``FetchError`` (status 404: none)."""
    url = f"{base_url.rstrip('/')}/versions/{version}"
    try:
        r = httpx.get(url, headers=_headers(token), timeout=timeout)
    except httpx.HTTPError as e:
        raise FetchError(f"{url}: {e!r}") from e
    _check(r, url)
    return r.json()


def download(url: str, dest: Path, size: int, token: str, timeout: float = 300) -> Path:
    """Stream ``url`` into ``dest`` (through a temporary file renamed into place) and check that
    exactly ``size`` bytes came; ``FetchError`` otherwise, with nothing left at ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with (
            httpx.stream("GET", url, headers=_headers(token), timeout=timeout) as r,
            tmp.open("wb") as out,
        ):
            _check(r, url)
            for block in r.iter_bytes(CHUNK):
                out.write(block)
        got = tmp.stat().st_size
        if got != size:
            raise FetchError(f"{url}: {got} bytes arrived, the trainer listed {size}")
        tmp.replace(dest)
    except httpx.HTTPError as e:
        raise FetchError(f"{url}: {e!r}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return dest


@dataclass(frozen=True)
class Fetched:
    version: int
    path: Path
    num_bytes: int
    seconds: float


def fetch_version(base_url: str, dest: Path, token: str, version: str = "latest") -> Fetched:
    """Every file of a published version into the folder ``dest`` (replaced as a whole, so a
    reader sees the old folder or the complete new one); ``FetchError`` (404: none published)."""
    t0 = time.perf_counter()
    try:
        info = manifest(base_url, token, version)
    except FetchError as e:
        if e.status == 404:
            raise NothingPublished(f"{e}: no version published yet", 404) from e
        raise
    number, files = int(info["version"]), dict(info["files"])
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    _remove(tmp)
    for name, size in files.items():
        download(f"{base_url.rstrip('/')}/versions/{number}/{name}", tmp / name, int(size), token)
    _remove(dest)
    tmp.rename(dest)
    seconds = time.perf_counter() - t0
    return Fetched(number, dest, sum(int(s) for s in files.values()), seconds)


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)


def boot_weights(
    base_url: str,
    dest: Path,
    token: str,
    base_model: str | None,
    wait_s: float,
    poll_s: float = 5.0,
) -> Path | None:
    """What a new replica boots from: the newest published version, fetched into ``dest``, or
    None for the base model.

    Nothing published yet: the base model at once (the trainer loads its first version into
    every replica it finds); without a base model (a preset the trainer creates), wait for the
    first version. The trainer unreachable or failing (starting, restarting): retried for
    ``wait_s``, then the base model (a starting trainer loads its policy into every replica
    before it rolls out). The token refused: ``FetchError`` at once (a misconfigured run, which
    waiting does not mend)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            got = fetch_version(base_url, dest, token)
        except NothingPublished:
            if base_model:
                return None
            log.info("no policy version published at %s yet: waiting", base_url)
        except FetchError as e:
            if e.status in (401, 403):
                raise
            if base_model and time.monotonic() >= deadline:
                log.warning("%s; booting from the base model %s", e, base_model)
                return None
            log.info("%s: retrying", e)
        else:
            log.info(
                "policy version %d fetched (%.1f MB in %.1fs)",
                got.version,
                got.num_bytes / 1e6,
                got.seconds,
            )
            return got.path
        time.sleep(poll_s)
