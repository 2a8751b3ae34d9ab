"""Each session to the executor pool of its task environment (``sandbox.backend: pods``).

On sandbox pods a task environment is a pool of its own image beside the default pool
(``gagar.operator.builders.sandbox``), and the run's ConfigMap says where each is
(``sandbox-pools.json``). ``RoutingFactory`` sends a session or a verification of environment E
to E's pool, the name taken off (E's executor runs E's image: it has no environments of its
own), and one of no environment to the default pool. A name the run does not declare is a
``SandboxError`` naming those it does, never a session in the wrong image.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from gagar import SANDBOX_POOLS_FILE
from gagar.sandbox.client import HttpPoolFactory
from gagar.sandbox.types import (
    Limits,
    SandboxError,
    Session,
    SessionRequest,
    VerificationFactory,
)


class RoutingFactory(VerificationFactory):
    """``default`` for requests of no environment, ``pools[E]`` for those of E."""

    def __init__(
        self, default: VerificationFactory, pools: Mapping[str, VerificationFactory]
    ) -> None:
        self.default, self.pools = default, dict(pools)

    def open(self, request: SessionRequest) -> Session:
        env = request.environment
        if env is None:
            return self.default.open(request)
        if env not in self.pools:
            have = ", ".join(sorted(self.pools)) or "none"
            raise SandboxError(f"no executor pool for environment {env!r} (this run's: {have})")
        return self.pools[env].open(replace(request, environment=None))

    def close(self) -> None:
        for factory in (self.default, *self.pools.values()):
            close = getattr(factory, "close", None)
            if close is not None:
                close()


def pool_factory(
    default_url: str, pools: Mapping[str, str], limits: Limits | None = None
) -> HttpPoolFactory | RoutingFactory:
    """The executor pools of a run: the default one at ``default_url`` and each environment's
    (``pools``: name -> URL), every session with ``limits`` unless it names its own."""
    default = HttpPoolFactory(default_url, limits=limits)
    if not pools:
        return default
    by_env = {env: HttpPoolFactory(url, limits=limits) for env, url in pools.items()}
    return RoutingFactory(default, by_env)


def read_pools(config_dir: Path) -> dict[str, str]:
    """The run's environment pools from its ConfigMap (``sandbox-pools.json`` in
    ``config_dir``: name -> URL); none where the file is not there (no environments on pods)."""
    file = config_dir / SANDBOX_POOLS_FILE
    if not file.is_file():
        return {}
    try:
        pools = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise SandboxError(f"{file}: {err}") from None
    if not isinstance(pools, dict) or not all(isinstance(u, str) for u in pools.values()):
        raise SandboxError(f"{file}: not a map of environment names to URLs")
    return pools
