"""Run the real kopf runtime (``kopf.operator``) in a thread against a :class:`KubeEmulator`.

Given an emulator, the operator logs in to it as the admin through an ``@kopf.on.login`` handler
added to the given registry (so no environment variable or global client configuration is
touched); given ``None``, the registry brings its own login handler (``gagar.operator.main.
add_login`` with a kubeconfig: the path a real cluster takes). kopf runs ``standalone`` (no
peering) and stops through its own ``stop_flag`` when the ``with`` block ends. Settings are tuned
for tests: short watch timeouts so that reconnections happen quickly, and finalizer/annotation
storage as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import kopf

from .emulator import KubeEmulator
from .rbac import ADMIN_TOKEN


@dataclass
class KopfHandle:
    thread: threading.Thread
    stop_flag: threading.Event
    ready_flag: threading.Event
    errors: list[BaseException] = field(default_factory=list)


def test_settings(settings: kopf.OperatorSettings) -> kopf.OperatorSettings:
    """Fast but faithful settings: server-side watch timeouts of a few seconds, quick retries."""
    settings.watching.server_timeout = 5
    settings.watching.client_timeout = 10
    settings.watching.connect_timeout = 2
    settings.watching.reconnect_backoff = 0.1
    settings.networking.request_timeout = 5
    settings.networking.error_backoffs = (0.1, 0.2, 0.5, 1)
    settings.queueing.idle_timeout = 0.5
    settings.queueing.exit_timeout = 1
    settings.queueing.error_delays = (0.1, 0.2, 0.5, 1, 2)
    return settings


@contextlib.contextmanager
def run_operator(
    kube: KubeEmulator | None,
    registry: kopf.OperatorRegistry,
    namespaces: Collection[str] = ("default",),
    configure: Callable[[kopf.OperatorSettings], None] | None = None,
    startup_timeout: float = 15.0,
) -> Iterator[KopfHandle]:
    """Run kopf with ``registry``'s handlers in a thread; stop it when the block exits.

    ``namespaces=()`` runs cluster-wide. ``configure`` can adjust the settings further.
    """

    # The login handler is added once per registry (kopf keeps handlers forever) and reads the
    # emulator of the current run, so a registry (e.g. kopf's default one) can be run again.
    if kube is not None and not getattr(registry, "_kube_emulator_login", False):

        @kopf.on.login(registry=registry)
        def _login(**_: object) -> kopf.ConnectionInfo:
            target = registry._kube_emulator  # type: ignore[attr-defined]
            return kopf.ConnectionInfo(server=target.url, scheme="Bearer", token=ADMIN_TOKEN)

        registry._kube_emulator_login = True  # type: ignore[attr-defined]
    registry._kube_emulator = kube  # type: ignore[attr-defined]
    settings = test_settings(kopf.OperatorSettings())
    if configure is not None:
        configure(settings)
    handle = KopfHandle(threading.Thread(), threading.Event(), threading.Event())

    def target() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    settings=settings,
                    standalone=True,
                    clusterwide=not namespaces,
                    namespaces=list(namespaces),
                    stop_flag=handle.stop_flag,
                    ready_flag=handle.ready_flag,
                )
            )
        except BaseException as e:  # surfaced to the test by the context manager
            handle.errors.append(e)
            handle.ready_flag.set()

    handle.thread = threading.Thread(target=target, name="kopf-operator", daemon=True)
    handle.thread.start()
    try:
        if not handle.ready_flag.wait(startup_timeout):
            raise TimeoutError("kopf did not become ready")
        if handle.errors:
            raise RuntimeError("kopf failed to start") from handle.errors[0]
        yield handle
    finally:
        handle.stop_flag.set()
        handle.thread.join(timeout=20)
    if handle.errors:
        raise RuntimeError("kopf exited with an error") from handle.errors[0]
