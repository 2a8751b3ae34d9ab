"""``KubeEmulator``: the emulated API server in a background thread, plus the Python API tests use.

Start it (``with KubeEmulator() as kube:``), point clients at ``kube.url`` or at
``kube.kubeconfig_path``, and drive the simulated cluster from the test: load manifests, read and
write objects without HTTP, mark Jobs done, hold Deployments unready, inject faults, drop watch
streams, or forget history so that resumed watches get 410 Gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pathlib
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import yaml
from aiohttp import web

from . import tls
from .controllers import Controllers
from .faults import Faults
from .rbac import ADMIN_TOKEN
from .resources import ResourceType
from .selectors import make_predicate
from .server import Server
from .store import Store, WriteOptions


def poll_until(condition: Callable[[], Any], timeout: float, interval: float) -> Any:
    """Poll ``condition`` until it returns something truthy; raise ``TimeoutError`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s: {condition}")
        time.sleep(interval)


class KubeEmulator:
    emulated = True

    def __init__(
        self,
        *,
        bookmark_interval: float = 1.0,
        history_limit: int = 10_000,
        deployment_delay: float = 0.1,
        strict_fields: bool = False,
        openapi_validate: bool = False,
        tls_port: int = 0,
    ) -> None:
        self.store = Store(history_limit=history_limit)
        self.store.strict_fields = strict_fields
        # every built-in object written is also checked against Kubernetes' OpenAPI schemas
        # (kubernetes-validate, strict: unknown fields refused); ~40 ms a write, so opt-in
        self.store.openapi_validate = openapi_validate
        self.faults = Faults()
        self.controllers = Controllers(self.store, deployment_delay=deployment_delay)
        self.server = Server(self.store, self.faults, bookmark_interval)
        self.port = 0
        self.tls_port = tls_port  # 0: a free one; else this one (a dev cluster's fixed port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="kube-emulator-")
        self.kubeconfig_path = pathlib.Path(self._tmp.name) / "kubeconfig"
        # the same admin over HTTPS: what kubectl needs to send its token (see tls.py)
        self.tls_kubeconfig_path = pathlib.Path(self._tmp.name) / "kubeconfig-tls"

    # ----- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"

    def start(self) -> KubeEmulator:
        with socket.socket() as s, socket.socket() as t:
            s.bind(("127.0.0.1", 0))
            t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            t.bind(("127.0.0.1", self.tls_port))
            self.port, self.tls_port = s.getsockname()[1], t.getsockname()[1]
        self._cert, self._tls = tls.self_signed(pathlib.Path(self._tmp.name))
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="kube-emulator", daemon=True
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Kubernetes API emulator did not start within 10 s")
        self.controllers.start()
        self.write_kubeconfig(self.kubeconfig_path)
        self.write_kubeconfig(self.tls_kubeconfig_path, tls=True)
        return self

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(
            self.server.app(), handle_signals=False, shutdown_timeout=0.5, access_log=None
        )
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        secure = web.TCPSite(self._runner, "127.0.0.1", self.tls_port, ssl_context=self._tls)
        self._loop.run_until_complete(secure.start())
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    def stop(self) -> None:
        self.controllers.stop()
        if self._loop is not None and self._runner is not None:
            self.drop_watches()
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            future.result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._tmp.cleanup()

    def __enter__(self) -> KubeEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- clients ---------------------------------------------------------------------------

    def service_account_kubeconfig(self, namespace: str, name: str) -> pathlib.Path:
        """A kubeconfig whose requests are the ServiceAccount ``namespace/name``: RBAC applies."""
        token = self.server.authorizer.issue(namespace, name)
        path = pathlib.Path(self._tmp.name) / f"kubeconfig-{namespace}-{name}"
        return self.write_kubeconfig(path, token=token)

    def write_kubeconfig(
        self,
        path: str | pathlib.Path,
        namespace: str = "default",
        token: str = ADMIN_TOKEN,
        tls: bool = False,
    ) -> pathlib.Path:
        """A kubeconfig for ``token``; ``tls``: over HTTPS (kubectl sends tokens only there)."""
        cluster: dict = {"server": self.url}
        if tls:
            data = base64.b64encode(self._cert.read_bytes()).decode()
            cluster = {"server": self.tls_url, "certificate-authority-data": data}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": cluster}],
            "users": [{"name": "emulator", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
        }
        path = pathlib.Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    def api_client(self, kubeconfig: pathlib.Path | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` bound to this emulator (not the global default), as
        the admin or as the identity of ``kubeconfig``."""
        import kubernetes

        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig or self.kubeconfig_path), client_configuration=configuration
        )
        return kubernetes.client.ApiClient(configuration)

    @contextlib.contextmanager
    def as_default_client(self) -> Iterator[None]:
        """Make ``kubernetes.client.ApiClient()`` (no arguments) talk to this emulator.

        For operator code that builds its clients from the global default configuration; the
        previous default is restored afterwards.
        """
        import kubernetes

        previous = kubernetes.client.Configuration.get_default_copy()
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(self.kubeconfig_path), client_configuration=configuration
        )
        kubernetes.client.Configuration.set_default(configuration)
        try:
            yield
        finally:
            kubernetes.client.Configuration.set_default(previous)

    # ----- objects without HTTP --------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> ResourceType:
        return self.store.type_by_kind(api_version, kind)

    def create(self, obj: dict, namespace: str | None = None) -> dict:
        rt = self.resource(obj["apiVersion"], obj["kind"])
        ns = (
            (namespace or obj.get("metadata", {}).get("namespace") or "default")
            if rt.namespaced
            else None
        )
        return self.store.create(rt, ns, obj, "test")

    def load_yaml(self, source: str | pathlib.Path, namespace: str | None = None) -> list[dict]:
        """Create every document of a YAML file (or YAML text), CRDs included, in order."""
        text = (
            pathlib.Path(source).read_text()
            if isinstance(source, pathlib.Path) or "\n" not in str(source)
            else str(source)
        )
        return [self.create(doc, namespace) for doc in yaml.safe_load_all(text) if doc]

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        rt = self.resource(api_version, kind)
        return self.store.get(rt, (namespace or "default") if rt.namespaced else None, name)

    def find(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict | None:
        try:
            return self.get(api_version, kind, name, namespace)
        except Exception:
            return None

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict]:
        rt = self.resource(api_version, kind)
        return self.store.list(
            rt, namespace if rt.namespaced else None, make_predicate(label_selector, None)
        )[0]

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        change: Callable[[dict], dict],
        namespace: str | None = None,
        subresource: str = "",
        manager: str = "test",
    ) -> dict:
        """Read-modify-write by a Python function (``change`` gets a copy, returns the new body)."""
        rt = self.resource(api_version, kind)
        ns = (namespace or "default") if rt.namespaced else None
        return self.store.write(rt, ns, name, change, WriteOptions(manager, subresource))

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: str = "Background",
    ) -> dict:
        rt = self.resource(api_version, kind)
        ns = (namespace or "default") if rt.namespaced else None
        return self.store.delete(rt, ns, name, {"propagationPolicy": propagation})

    # ----- simulation and faults -------------------------------------------------------------

    def succeed_job(self, name: str, namespace: str = "default") -> None:
        self.controllers.succeed_job(namespace, name)

    def fail_job(
        self, name: str, namespace: str = "default", reason: str = "BackoffLimitExceeded"
    ) -> None:
        self.controllers.fail_job(namespace, name, reason)

    def hold_deployment(self, name: str, ready: int | None, namespace: str = "default") -> None:
        self.controllers.hold_deployment(namespace, name, ready)

    def drop_watches(self, plural: str | None = None) -> int:
        """Cut every open watch stream (of one resource plural, or all); return how many."""
        with self.store.lock:
            victims = [
                w for w in self.store.watchers if plural is None or w.storage_key[1] == plural
            ]
        for w in victims:
            w.drop()
        return len(victims)

    def compact_history(self) -> None:
        self.store.compact()

    def requests_for(self, verb: str | None = None, path: str | None = None) -> list[dict]:
        """Recorded requests (method, path, query, verb, code, content_type), filtered."""
        return [
            r
            for r in list(self.server.requests)
            if (verb is None or r["verb"] == verb) and (path is None or path in r["path"])
        ]

    def wait_for(
        self, condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; raise ``TimeoutError`` otherwise."""
        return poll_until(condition, timeout, interval)
