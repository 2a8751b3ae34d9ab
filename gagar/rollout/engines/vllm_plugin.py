"""gagar's vLLM plugin: the ``gagar_safetensors`` weight-transfer backend.

vLLM loads this module in every one of its processes through the ``vllm.general_plugins``
entry point (see pyproject.toml), so ``--weight-transfer-config '{"backend":
"gagar_safetensors"}'`` resolves in the API server, the engine core and the workers alike.
vLLM's own transports (nccl, nccl_m2n, ipc, ...) all need CUDA; this one reads the policy
version the trainer published as safetensors, so the control path (pause, start/update/finish
weight update, weight version) is the same on CPU and GPU. The trainer names the source at
``/init_weight_transfer_engine``: a ``root`` directory the workers share with it (one machine),
or the ``url`` of its weight server (a cluster, ``weight_http``): each worker then fetches the
version's file into local disk (``$GAGAR_WEIGHTS_DIR``, the pod's ``emptyDir``) once per update,
loads it, and deletes it when the update finishes.

What it guards (the routes themselves take only callers with the run's token, ``vllm_auth``;
these checks stand even against such a caller): a worker only opens files under the root the
trainer named; it fetches only from the weight server the operator named in the pod
(``$GAGAR_WEIGHTS_URL``: an ``init_info`` naming any other URL is refused), only a version's
file under it, and presents the run's token there (``$GAGAR_WEIGHT_SYNC_TOKEN``); a file whose
size differs from the one the trainer announced is refused; every name in an update must exist
in the file, otherwise the update fails naming the tensor. Only imported inside a process that
has vLLM.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from gagar import env
from gagar.rollout.engines.vllm_auth import TOKEN_ENV
from gagar.rollout.engines.weight_sync import BACKEND, ReplicaClient, SafetensorsWeightSync

_FILE = r"/versions/\d+/[A-Za-z0-9][A-Za-z0-9._-]*\.safetensors"  # a version's file on the server


@dataclass
class SafetensorsInitInfo(WeightTransferInitInfo):
    root: str = ""  # the shared directory policy versions are published under, or
    url: str = ""  # the trainer's weight server that serves them


@dataclass
class SafetensorsUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    file: str = ""  # a model.safetensors under the root, or
    url: str = ""  # its URL on the weight server
    size: int = -1  # the file's size in bytes (with ``url``)


class SafetensorsWeightTransferEngine(
    WeightTransferEngine[SafetensorsInitInfo, SafetensorsUpdateInfo]
):
    """Worker side: load the named tensors of a published version into the served model."""

    init_info_cls = SafetensorsInitInfo
    update_info_cls = SafetensorsUpdateInfo
    root: Path | None = None
    url: str | None = None
    fetched: Path | None = None  # this update's file, fetched from ``url``

    def init_transfer_engine(self, init_info: SafetensorsInitInfo) -> None:
        if bool(init_info.root) == bool(init_info.url):
            raise ValueError("init_info names either a root directory or a url")
        self.root, self.url = None, None
        if init_info.root:
            self.root = Path(init_info.root).resolve()
            return
        named = os.environ.get(env.WEIGHTS_URL, "").rstrip("/")
        if not named or init_info.url.rstrip("/") != named:
            raise ValueError(
                f"{init_info.url} is not the weight server this replica was given "
                f"(${env.WEIGHTS_URL}={named or 'unset'})"
            )
        if not os.environ.get(TOKEN_ENV):
            raise RuntimeError(f"${TOKEN_ENV} is not set: the weight server would refuse us")
        self.url = named

    def start_weight_update(self) -> None:
        # Layerwise reload re-runs each layer's post-load processing; vLLM-CPU repacks linear
        # weights for oneDNN after loading, so copying into the parameters alone would not
        # reach the kernels.
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        try:
            finalize_layerwise_reload(self.model, self.model_config)
            _reprocess_tied_embeddings(self.model)
        finally:
            self._drop_fetched()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has no accelerator
        # to wait for on CPU; file reads are synchronous anyway.
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            # vLLM ends the session when a chunk fails but does not finish the layerwise
            # reload, which leaves parameters on the meta device: the next forward pass would
            # kill the engine core. Finishing here puts every layer that got no new weights
            # back on its old kernel tensors, so the replica stays servable.
            self.finish_weight_update()
            raise

    def receive_weights(self, update_info: SafetensorsUpdateInfo) -> None:
        from safetensors import safe_open

        if update_info.url:
            file = self._fetch(update_info)
        else:
            file = self._checked_file(update_info.file)
        with safe_open(str(file), framework="pt", device="cpu") as f:
            present = set(f.keys())
            missing = [n for n in update_info.names if n not in present]
            if missing:
                raise ValueError(f"{file}: tensor {missing[0]!r} missing ({len(missing)} in all)")
            weights = [(n, f.get_tensor(n).to(self.device)) for n in update_info.names]
        self.model.load_weights(weights)

    def _checked_file(self, file: str) -> Path:
        if self.root is None:
            raise RuntimeError("init_weight_transfer_engine must be called before update_weights")
        path = Path(file).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{path} is outside the weight-transfer root {self.root}")
        if not path.is_file():
            raise FileNotFoundError(f"published weights {path} do not exist")
        return path

    def _fetch(self, update_info: SafetensorsUpdateInfo) -> Path:
        """The update's file on local disk: fetched from the weight server on the first chunk
        that names it, under a lock shared by the pod's workers (tensor-parallel workers fetch
        it once), and kept until the update finishes."""
        from gagar.rollout.engines.weight_http import download

        if self.url is None:
            raise RuntimeError("init_weight_transfer_engine named no weight server")
        rest = update_info.url.removeprefix(self.url)
        if rest == update_info.url or not re.fullmatch(_FILE, rest):
            raise ValueError(f"{update_info.url} is not a published file of {self.url}")
        local = _weights_dir() / "updates" / rest.strip("/").replace("/", "-")
        local.parent.mkdir(parents=True, exist_ok=True)
        with (local.parent / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not local.is_file() or local.stat().st_size != update_info.size:
                token = os.environ[TOKEN_ENV]
                download(update_info.url, local, update_info.size, token)
        self.fetched = local
        return local

    def _drop_fetched(self) -> None:
        if self.fetched is not None:
            self.fetched.unlink(missing_ok=True)  # another worker of the pod may have done it
            self.fetched = None

    def shutdown(self) -> None:
        self._drop_fetched()
        self.root, self.url = None, None


def _weights_dir() -> Path:
    """Where fetched versions go: the pod's ``emptyDir`` (``$GAGAR_WEIGHTS_DIR``), else a
    temporary directory."""
    named = os.environ.get(env.WEIGHTS_DIR)
    return Path(named) if named else Path(tempfile.gettempdir()) / "gagar-weights"


def _reprocess_tied_embeddings(model: Any) -> None:
    """Rebuild the post-load state of every embedding layer whose weight another layer shares.

    With ``tie_word_embeddings`` vLLM's ``lm_head`` holds the embedding's own Parameter and its
    ``load_weights`` skips ``lm_head.weight``, so the layerwise reload processes the embedding
    layer and only puts ``lm_head``'s old tensors back ("no weights were loaded"). The values
    are shared and new, but vLLM-CPU's ``process_weights_after_loading`` gives ``lm_head`` a
    prepacked copy of the weight (oneDNN or AMX kernels) that logits are computed from, and
    that copy would stay on the previous version. Rerunning the unquantized embedding method's
    processing is idempotent (it only rebuilds that dispatch; a no-op on GPUs).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    holders: dict[int, list[Any]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders.setdefault(id(param), []).append(module)
    for modules in holders.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if isinstance(method, UnquantizedEmbeddingMethod):
                method.process_weights_after_loading(module)


@dataclass
class SafetensorsTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    root: str
    base_model: str
    first_version: int = 1


class SafetensorsTrainerWeightTransferEngine(
    TrainerWeightTransferEngine[SafetensorsTrainerInitInfo]
):
    """Trainer side, for trainers that run where vLLM is importable (vLLM's factory API).

    Rank 0 publishes and drives the replica; other ranks only iterate the source so that
    gathers (a collective) stay in lockstep. Trainers without vLLM use
    ``SafetensorsWeightSync`` directly; both send the same payloads.
    """

    init_info_cls = SafetensorsTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if source is None:
            raise ValueError("the gagar_safetensors trainer engine needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine.version = init_info.first_version
        engine.sync = SafetensorsWeightSync(
            [client], Path(init_info.root), Path(init_info.base_model)
        )
        if engine.is_sender:
            client.init_weight_transfer_engine({"root": str(Path(init_info.root).resolve())})
        return engine

    def send_weights(self) -> None:
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        self.sync.sync(iter(self.source), self.version)
        self.version += 1


def register() -> None:
    """Entry point: add the backend to both of vLLM's registries (idempotent per process)."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, SafetensorsWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, SafetensorsTrainerWeightTransferEngine
        )


__all__ = ["ReplicaClient", "register"]
