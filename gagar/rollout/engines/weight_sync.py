"""Trainer → vLLM weight sync over vLLM's own RL weight-transfer control path.

The control path is vLLM's (``VLLM_SERVER_DEV_MODE=1`` routes): ``/pause`` →
``/start_weight_update`` → ``/update_weights`` (one call per chunk) → ``/finish_weight_update``
with the new ``weight_version`` → ``/resume``; ``/weight_info`` reads the version back. What moves
the bytes is the backend chosen with ``--weight-transfer-config``:

* ``gagar_safetensors`` (registered by gagar's vLLM plugin, works on CPU and GPU): the trainer
  writes each policy version as a Hugging Face safetensors folder (``<root>/v<version>/``,
  published atomically with a ``latest`` pointer), and the workers read the tensors back from
  that file: from the directory itself where they share it (one machine: ``init_info`` names
  the ``root``), or fetched over HTTP from the trainer's weight server (a cluster: ``init_info``
  names its ``url``, ``weight_http``), so no volume is shared. The same folder is what a new
  autoscaled replica boots from, so publication and transfer are one write.
* ``nccl`` / ``nccl_m2n`` on GPUs: vLLM's own trainer engines (see tests/gpu).

This module imports neither vLLM nor torch.distributed: the trainer's Python environment need
not have vLLM installed (on CPU machines vLLM lives in its own virtual environment).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gagar.rollout.engines.vllm_auth import TOKEN_ENV, control_token
from gagar.wire import HF_SIDE_FILES

BACKEND = "gagar_safetensors"
VERSION_FILE = "gagar-version.json"  # written last into a version's folder, before its rename


class WeightSyncError(RuntimeError):
    """A replica refused or failed a step of the weight update; names the replica and step."""


@dataclass(frozen=True)
class PublishedVersion:
    """One policy version on the shared volume."""

    version: int
    path: Path  # the HF folder: config, tokenizer, model.safetensors
    names: list[str]
    num_bytes: int


def _save_safetensors(weights: Iterable[tuple[str, object]], file: Path) -> tuple[list[str], int]:
    """Write ``(hf_name, tensor)`` pairs to one safetensors file; refuse duplicate names.

    A tensor that is a view of the same memory as an earlier one (tied weights: an HF state dict's
    ``lm_head.weight`` is ``model.embed_tokens.weight`` when ``tie_word_embeddings``) is written
    once, under its first name, as ``save_pretrained`` does; vLLM loads it into the embedding,
    and the plugin's backend rebuilds the tied output layer's kernels after the update."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}  # torch.Tensor (torch is imported by the caller)
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    storages: set[int] = set()
    for name, tensor in weights:
        if name in tensors:
            raise ValueError(f"weight {name!r} yielded twice by the trainer")
        t = tensor.detach().to("cpu")  # type: ignore[attr-defined]
        alias = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if alias in seen:
            continue
        seen.add(alias)
        storage = t.untyped_storage().data_ptr()
        # another view of memory already written (safetensors refuses shared storage): a copy
        tensors[name] = t.clone() if storage in storages else t.contiguous()
        storages.add(storage)
    if not tensors:
        raise ValueError("the trainer yielded no weights")
    save_file(tensors, str(file), metadata={"format": "pt"})
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return list(tensors), size


def publish_version(
    weights: Iterable[tuple[str, object]], root: Path, version: int, base_model: Path
) -> PublishedVersion:
    """Write version ``version`` under ``root`` atomically and point ``root/latest`` at it.

    The folder is complete HF format (config and tokenizer copied from ``base_model``), so
    ``vllm serve root/latest`` boots a fresh replica on the current policy. Writing goes to a
    temporary folder renamed into place, so a reader never sees half a version.
    """
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    tmp = root / f".v{version}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for side in HF_SIDE_FILES:
        if (base_model / side).exists():
            shutil.copy2(base_model / side, tmp / side)
    names, size = _save_safetensors(weights, tmp / "model.safetensors")
    (tmp / VERSION_FILE).write_text(json.dumps({"version": version, "time": time.time()}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _point_latest(root, final.name)
    return PublishedVersion(version=version, path=final, names=names, num_bytes=size)


def _point_latest(root: Path, target: str) -> None:
    link = root / f".latest-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    link.replace(root / "latest")


def prune_versions(root: Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` versions; return the deleted version numbers."""
    versions = sorted(int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit())
    doomed = versions[:-keep] if keep > 0 else versions
    for v in doomed:
        shutil.rmtree(root / f"v{v}")
    return doomed


class ReplicaClient:
    """The RL control routes of one vLLM server (the shape of vLLM's ``VLLMWeightSyncClient``)."""

    def __init__(self, base_url: str, timeout: float = 300.0, token: str | None = None) -> None:
        """``token``: what the server's control routes require (``vllm_auth``); by default
        this process's, ``$GAGAR_WEIGHT_SYNC_TOKEN`` or the one its ``VllmServer`` got."""
        self.base_url = base_url.rstrip("/")
        # One connection per call: vLLM's server drops a connection after a route raised, and
        # reusing it would turn the next control call into a connection reset.
        auth = f"Bearer {token or control_token()}"
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            headers={"Connection": "close", "Authorization": auth},
        )

    def _post(self, path: str, payload: dict | None = None, params: dict | None = None) -> dict:
        try:
            r = self._http.post(path, json=payload, params=params)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"{self.base_url}{path}: {e!r}") from e
        if r.status_code in (401, 403):
            raise WeightSyncError(
                f"{self.base_url}{path} -> {r.status_code}: the replica refused the weight-sync "
                f"token (${TOKEN_ENV} must be the same for the trainer and the server)"
            )
        if r.status_code == 404:
            raise WeightSyncError(
                f"{self.base_url}{path} not found: serve vLLM with VLLM_SERVER_DEV_MODE=1"
            )
        if r.status_code >= 400:
            raise WeightSyncError(f"{self.base_url}{path} -> {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else {}

    def pause(self) -> None:
        # "keep" freezes in-flight requests and continues them on the new weights after
        # /resume, so an agent turn is never lost to a sync (its tokens then mix two versions,
        # which the importance correction against the engine's log-probs accounts for).
        self._post("/pause", params={"mode": "keep"})

    def resume(self) -> None:
        self._post("/resume")

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info: dict | list[dict]) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self._post("/finish_weight_update", body)

    def update_weight_version(self, new_version: str) -> None:
        self._post("/update_weight_version", {"new_version": new_version})

    def weight_version(self) -> str | None:
        r = self._http.get("/weight_info")
        r.raise_for_status()
        return r.json().get("weight_version")

    def close(self) -> None:
        self._http.close()


def chunked(names: Sequence[str], size: int) -> Iterator[list[str]]:
    """Split the parameter names into update chunks of at most ``size`` names."""
    if size <= 0:
        raise ValueError(f"chunk size must be positive, got {size}")
    for i in range(0, len(names), size):
        yield list(names[i : i + size])


@dataclass
class SyncReport:
    """What one sync did, for metrics and the bench."""

    version: int
    num_tensors: int
    num_bytes: int
    publish_seconds: float
    transfer_seconds: float
    replicas: int


class SafetensorsWeightSync:
    """Publishes each policy version and loads it into every replica through vLLM's RL API.

    ``sync(weights, version)`` takes the trainer's ``(hf_name, tensor)`` iterator (already
    gathered across TP/EP into HF names and layouts). Replicas are updated one after another;
    if one fails the error names it, and the others keep serving (those already updated hold the
    new version, visible at ``/weight_info``).
    """

    def __init__(
        self,
        replicas: Sequence[ReplicaClient],
        root: Path,
        base_model: Path,
        chunk: int = 64,
        url: str | None = None,
    ) -> None:
        """``url``: the weight server (``weight_http``) serving ``root``, which the replicas
        fetch each version from; None: they read ``root`` itself (a shared file system)."""
        if not replicas:
            raise ValueError("weight sync needs at least one replica")
        self.replicas = list(replicas)
        self.root, self.base_model, self.chunk = Path(root), Path(base_model), chunk
        self.url = url.rstrip("/") if url else None

    def init_info(self) -> dict[str, str]:
        """What ``/init_weight_transfer_engine`` hands a replica: where versions come from."""
        return {"url": self.url} if self.url else {"root": str(self.root.resolve())}

    def update_info(self, pub: PublishedVersion, names: list[str]) -> dict[str, Any]:
        """One ``/update_weights`` chunk: the version's file (its URL, or path) and the names."""
        file = pub.path / "model.safetensors"
        if self.url:
            url = f"{self.url}/versions/{pub.version}/{file.name}"
            return {"url": url, "size": file.stat().st_size, "names": names}
        return {"file": str(file.resolve()), "names": names}

    def init(self) -> None:
        """Hand the transfer source to every replica (vLLM's ``/init_weight_transfer_engine``)."""
        for r in self.replicas:
            r.init_weight_transfer_engine(self.init_info())

    def sync(self, weights: Iterable[tuple[str, object]], version: int) -> SyncReport:
        t0 = time.perf_counter()
        pub = self.publish(weights, version)
        t1 = time.perf_counter()
        self.load(pub)
        t2 = time.perf_counter()
        return SyncReport(
            version, len(pub.names), pub.num_bytes, t1 - t0, t2 - t1, len(self.replicas)
        )

    def publish(self, weights: Iterable[tuple[str, object]], version: int) -> PublishedVersion:
        """Only write the version (replicas booting from ``root/latest`` pick it up)."""
        return publish_version(weights, self.root, version, self.base_model)

    def load(self, pub: PublishedVersion) -> None:
        """Load a published version into every replica, one after another."""
        for replica in self.replicas:
            self._load_into(replica, pub)

    def _load_into(self, replica: ReplicaClient, pub: PublishedVersion) -> None:
        """pause → start → update per chunk → finish(version) → resume on one replica.

        A replica whose update failed may hold a mix of old and new layers, so it stays paused
        (its requests wait) until a later sync succeeds; the error says so.
        """
        # vLLM's own VLLMWeightSyncClient has no pause/resume; gagar's ReplicaClient does.
        pausable = hasattr(replica, "pause")
        if pausable:
            replica.pause()
        try:
            replica.start_weight_update()
            for names in chunked(pub.names, self.chunk):
                replica.update_weights(self.update_info(pub, names))
            replica.finish_weight_update(weight_version=str(pub.version))
        except WeightSyncError as e:
            raise WeightSyncError(
                f"{e}\n(version {pub.version} not loaded; the replica stays paused until a sync succeeds)"
            ) from e
        if pausable:
            replica.resume()
