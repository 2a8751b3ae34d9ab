"""``RealCluster``: the object API of :class:`KubeEmulator`, over any kubeconfig (a real cluster).

Scenario tests written against ``create/get/find/list/patch/delete/load_yaml/wait_for``,
``kubeconfig_path``, ``api_client()`` and ``as_default_client()`` run unchanged on a real
cluster (``GAGAR_TEST_KUBECONFIG``). What only an emulator can do (faults, job outcomes, held
Deployments, dropped watches, history compaction) is absent here; check ``emulated`` first.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from .emulator import poll_until


class RealCluster:
    emulated = False

    def __init__(self, kubeconfig_path: str | pathlib.Path) -> None:
        import kubernetes
        from kubernetes.dynamic import DynamicClient

        self.kubeconfig_path = pathlib.Path(kubeconfig_path)
        self._configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=str(self.kubeconfig_path), client_configuration=self._configuration
        )
        self.url = self._configuration.host
        self._dynamic = DynamicClient(kubernetes.client.ApiClient(self._configuration))

    def api_client(self) -> Any:
        import kubernetes

        return kubernetes.client.ApiClient(self._configuration)

    @contextlib.contextmanager
    def as_default_client(self) -> Iterator[None]:
        import kubernetes

        previous = kubernetes.client.Configuration.get_default_copy()
        kubernetes.client.Configuration.set_default(self._configuration)
        try:
            yield
        finally:
            kubernetes.client.Configuration.set_default(previous)

    def _api(self, api_version: str, kind: str) -> Any:
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    def _ns(self, api: Any, namespace: str | None) -> str | None:
        return (namespace or "default") if api.namespaced else None

    def create(self, obj: dict, namespace: str | None = None) -> dict:
        api = self._api(obj["apiVersion"], obj["kind"])
        ns = self._ns(api, namespace or obj.get("metadata", {}).get("namespace"))
        result = api.create(body=obj, namespace=ns).to_dict()
        if obj["kind"] == "CustomResourceDefinition":
            self._dynamic.resources.invalidate_cache()
        return result

    def load_yaml(self, source: str | pathlib.Path, namespace: str | None = None) -> list[dict]:
        is_path = isinstance(source, pathlib.Path) or "\n" not in source
        text = pathlib.Path(source).read_text() if is_path else str(source)
        return [self.create(doc, namespace) for doc in yaml.safe_load_all(text) if doc]

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict:
        api = self._api(api_version, kind)
        return api.get(name=name, namespace=self._ns(api, namespace)).to_dict()

    def find(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self.get(api_version, kind, name, namespace)
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:  # fmt: skip
        api = self._api(api_version, kind)
        ns = namespace if api.namespaced else None
        return api.get(namespace=ns, label_selector=label_selector).to_dict()["items"]

    def patch(self, api_version: str, kind: str, name: str, change: Callable[[dict], dict],
              namespace: str | None = None, subresource: str = "") -> dict:  # fmt: skip
        """Read, change, replace (a 409 on a concurrent change is raised, not retried)."""
        api = self._api(api_version, kind)
        ns = self._ns(api, namespace)
        target = getattr(api, subresource) if subresource else api
        body = change(api.get(name=name, namespace=ns).to_dict())
        return target.replace(body=body, name=name, namespace=ns).to_dict()

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None,
               propagation: str = "Background") -> dict:  # fmt: skip
        api = self._api(api_version, kind)
        body = {"propagationPolicy": propagation}
        return api.delete(name=name, namespace=self._ns(api, namespace), body=body).to_dict()

    def wait_for(
        self, condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2
    ) -> Any:
        return poll_until(condition, timeout, interval)
