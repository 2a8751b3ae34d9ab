"""Each session to the executor pool of its task environment (``sandbox.backend: pods``).

On sandbox pods a task environment is a pool of its own image beside the default pool
(``gagar.operator.builders.sandbox``), and the run's ConfigMap says where each is
(``sandbox-pools.json``). ``RoutingFactory`` sends a session or a verification of environment E
to E's pool, the name taken off (E's executor runs E's image: it has no environments of its
own), and one of no environment to the default pool. A name the run does not declare is a
``SandboxError`` naming those it does, never a session in the wrong image.

A request of a task image (a row's own image, ``SessionRequest.image``) goes to that image's
pool, which the operator makes on demand (``gagar.operator.builders.images``) and lists in the
same file under ``image:<reference>``; the file is re-read when an image has no pool yet (the
kubelet refreshes a mounted ConfigMap within a minute or so). A factory given an
``ImageWait`` waits that long for a new image's pool to be listed and to have a ready executor
(the operator makes it when the trainer publishes ``images``, and its pods pull the image),
re-reading the file every ``poll_s``; an image that has none by then is a ``SandboxInfraError``
(the machinery's failure: the trajectory is invalid, never a failed test).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gagar import SANDBOX_POOLS_FILE
from gagar.sandbox.client import HttpPoolFactory
from gagar.sandbox.types import (
    Limits,
    SandboxError,
    SandboxInfraError,
    Session,
    SessionRequest,
    VerificationFactory,
)

IMAGE_KEY = "image:"  # a task image's pool in sandbox-pools.json (builders.images.IMAGE_POOL_KEY)
RECENT_IMAGES = 64  # the images a trainer lists: more than any operator's cap keeps warm


class RecentImages:
    """The task images asked for, most recent first, each once, at most ``limit``: the list the
    trainer publishes as ``sandboxImages`` (the operator keeps pools of its head, so an image
    in use stays at the front and one unused for long falls off and its pool is pruned).
    Thread-safe: rollouts open sessions from many threads. ``on_new(wanted)`` is called (outside
    the lock) when an image joins the list, so that the trainer publishes it at once rather than
    at its next step: the session that asked waits for the pool (``ImageWait``)."""

    def __init__(self, limit: int = RECENT_IMAGES) -> None:
        self.limit = limit
        self.on_new: Callable[[list[str]], None] | None = None
        self._order: dict[str, None] = {}  # insertion order: the oldest first
        self._missed: dict[str, int] = {}  # image -> sessions that found no pool in time
        self._lock = threading.Lock()

    def use(self, image: str) -> None:
        with self._lock:
            new = image not in self._order
            self._order.pop(image, None)
            self._order[image] = None
            while len(self._order) > self.limit:
                del self._order[next(iter(self._order))]
        if new and self.on_new is not None:
            self.on_new(self.wanted())

    def wanted(self) -> list[str]:
        with self._lock:
            return list(reversed(self._order))

    def missed(self, image: str) -> None:
        """A session of ``image`` found no ready pool by the end of its wait."""
        with self._lock:
            self._missed[image] = self._missed.get(image, 0) + 1

    def take_missed(self) -> dict[str, int]:
        """The sessions that found no pool since the last call, by image (the trainer's step)."""
        with self._lock:
            out, self._missed = self._missed, {}
        return out


@dataclass(frozen=True)
class ImageWait:
    """How long a session of a task image waits for the image's pool (``seconds``; 0: not at
    all) and how often the pools file is read again meanwhile (``poll_s``)."""

    seconds: float = 0.0
    poll_s: float = 5.0


class RoutingFactory(VerificationFactory):
    """``default`` for requests of no environment, ``pools[E]`` for those of E and
    ``pools["image:" + I]`` for those of task image I. ``refresh(known)``: the pools there are now
    that ``known`` lacks (name -> factory), asked when an image has no pool here. Every image
    asked for, found or not, goes to the front of ``images`` (what the trainer publishes); a
    new image's first session waits ``wait`` for its pool."""

    runs_task_images = True  # ``verify.placement`` asks for a task's image only of such a factory

    def __init__(
        self,
        default: VerificationFactory,
        pools: Mapping[str, VerificationFactory],
        refresh: Callable[[Collection[str]], Mapping[str, VerificationFactory]] | None = None,
        wait: ImageWait = ImageWait(),
    ) -> None:
        self.default, self.pools, self.refresh, self.wait = default, dict(pools), refresh, wait
        self.images = RecentImages()
        self._served: set[str] = set()  # images a pool served: a failure there is not a wait
        self._waits: dict[str, float] = {}  # image -> when the wait for its pool began
        self._lock = threading.Lock()

    def open(self, request: SessionRequest) -> Session:
        env = request.environment
        if request.image is not None:
            self.images.use(request.image)  # a miss too: it asks the operator for a pool
            return self._open_image(request.image, replace(request, image=None))
        if env is None:
            return self.default.open(request)
        if env not in self.pools:
            have = ", ".join(sorted(k for k in self.pools if not k.startswith(IMAGE_KEY)))
            raise SandboxError(
                f"no executor pool for environment {env!r} (this run's: {have or 'none'})"
            )
        return self.pools[env].open(replace(request, environment=None))

    def _open_image(self, image: str, request: SessionRequest) -> Session:
        """A session of ``image``'s pool, waiting while the pool is not listed or none of its
        executors is ready, until the image's wait ends (an image it served fails at once)."""
        deadline = self._deadline(image)
        while True:
            try:
                session = self._image_pool(image).open(request)
            except SandboxInfraError as err:
                left = deadline - time.monotonic()
                if image in self._served or left <= 0:
                    if image not in self._served:
                        self.images.missed(image)
                    waited = f" within {self.wait.seconds:.0f}s" if self.wait.seconds else ""
                    raise SandboxInfraError(f"{err}{waited}") from None
                time.sleep(min(self.wait.poll_s, left))
                continue
            self._served.add(image)
            return session

    def _deadline(self, image: str) -> float:
        """The end of ``image``'s wait, one for all its sessions: a group's sessions (made ahead,
        then again when that failed) wait ``wait.seconds`` together, not each in turn; once as
        long again has passed after it, the next session of the image waits anew."""
        now = time.monotonic()
        with self._lock:
            start = self._waits.get(image)
            if start is None or now > start + 2 * self.wait.seconds:
                self._waits[image] = start = now
        return start + self.wait.seconds

    def _image_pool(self, image: str) -> VerificationFactory:
        key = IMAGE_KEY + image
        with self._lock:  # sessions of many threads refresh: one at a time
            if key not in self.pools and self.refresh is not None:
                for k, factory in self.refresh(set(self.pools)).items():  # new pools join
                    self.pools.setdefault(k, factory)
            pool = self.pools.get(key)
        if pool is None:
            raise SandboxInfraError(
                f"no executor pool for the task image {image!r} yet: the operator makes one "
                "for each image the trainer lists in sandboxImages (up to its cap, "
                "--max-image-pools; a TaskImagesRefused Event names those left waiting)"
            )
        return pool

    def close(self) -> None:
        for factory in (self.default, *self.pools.values()):
            close = getattr(factory, "close", None)
            if close is not None:
                close()


def pool_factory(
    default_url: str,
    pools: Mapping[str, str],
    limits: Limits | None = None,
    config_dir: Path | None = None,
    wait: ImageWait = ImageWait(),
) -> HttpPoolFactory | RoutingFactory:
    """The executor pools of a run: the default one at ``default_url`` and each environment's
    and task image's (``pools``: name -> URL), every session with ``limits`` unless it names its
    own. ``config_dir``: where ``sandbox-pools.json`` is re-read for task images' new pools,
    each waited for as ``wait`` says."""
    default = HttpPoolFactory(default_url, limits=limits)
    if not pools and config_dir is None:
        return default

    def factories(urls: Mapping[str, str], known: Collection[str] = ()) -> dict[str, Any]:
        return {k: HttpPoolFactory(u, limits=limits) for k, u in urls.items() if k not in known}

    def refresh(known: Collection[str]) -> dict[str, Any]:
        if config_dir is None:
            return {}
        try:
            return factories(read_pools(config_dir), known)
        except SandboxError as err:  # the machinery's (a file half written): waited out, never
            raise SandboxInfraError(str(err)) from None  # a verification's failed test

    return RoutingFactory(default, factories(pools), refresh, wait)


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
