"""The policy on Megatron-Core: build, shard, load, gather, convert.

Public API (what the trainer driver and the rollout weight sync call):

- ``init_distributed(Parallel(tp, ep, pp), rank=None, world_size=None, init_method="env://")``:
  torch.distributed (gloo without a GPU, NCCL with) + Megatron's model-parallel groups; applies
  ``cpu_compat`` first when there is no GPU. ``destroy_distributed()`` undoes it.
- ``build_model(hf_config, parallel=None, dtype=torch.float32, parallel_output=True)``:
  a ``GPTModel`` for this rank from a config.json dict or ``PretrainedConfig``
  (Llama, Qwen2, Qwen3, Qwen3-MoE). ``model(ids, position_ids, None)`` gives logits
  ``(batch, seq, vocab / tp)``; with ``labels=`` it gives per-token losses ``(batch, seq)``.
- ``load_hf_into_megatron(model, hf_dir)``: fill this rank's shard from an HF folder.
- ``iter_hf_weights(model, all_ranks=False)``: ``(hf_name, full tensor)`` pairs gathered over
  TP/EP/PP (a collective: every rank iterates it); ``save_hf_checkpoint(model, out, side_files)``.
- ``convert_hf_to_megatron(hf_dir, out, tp, ep)``, ``export_megatron_to_hf(dir, hf_out)``,
  ``load_megatron_checkpoint(model, dir)``: the offline sharded folder format (``convert.py``).
- ``arch_from_hf(config) -> Arch``, ``read_config(dir)``; errors: ``UnsupportedModel``,
  ``CheckpointError`` (both ``ValueError``s naming the config key or tensor).
- ``create_preset("tiny", out)`` and ``fetch_model("smollm2-135m", out)``: offline policies.

CLI: ``gagar model convert|export|init|fetch`` (``cli.py``).

Limits: MoE runs with tp=1 (Megatron needs sequence parallelism for MoE+TP, which the
Transformer-Engine-free norm refuses) and the ``allgather`` token dispatcher; no virtual
pipeline stages; RoPE scaling other than the default is refused; on the CPU the patches in
``cpu_compat`` are pinned to megatron-core 0.16.1.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gagar.trainer.model.arch import Arch, UnsupportedModel, arch_from_hf
    from gagar.trainer.model.build import build_model
    from gagar.trainer.model.convert import (
        convert_hf_to_megatron,
        export_megatron_to_hf,
        load_megatron_checkpoint,
    )
    from gagar.trainer.model.hf_io import CheckpointError, read_config
    from gagar.trainer.model.parallel import Parallel, destroy_distributed, init_distributed
    from gagar.trainer.model.weights import (
        iter_hf_weights,
        load_hf_into_megatron,
        save_hf_checkpoint,
    )

# Each public name and the submodule that defines it. They are imported on first use (PEP 562):
# importing ``gagar.trainer.model.cli`` (every ``gagar`` command line does, to list its
# subcommands) must not pay for torch and Megatron.
_SOURCES = {
    "Arch": "arch",
    "UnsupportedModel": "arch",
    "arch_from_hf": "arch",
    "build_model": "build",
    "convert_hf_to_megatron": "convert",
    "export_megatron_to_hf": "convert",
    "load_megatron_checkpoint": "convert",
    "CheckpointError": "hf_io",
    "read_config": "hf_io",
    "Parallel": "parallel",
    "destroy_distributed": "parallel",
    "init_distributed": "parallel",
    "iter_hf_weights": "weights",
    "load_hf_into_megatron": "weights",
    "save_hf_checkpoint": "weights",
}


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Arch",
    "CheckpointError",
    "Parallel",
    "UnsupportedModel",
    "arch_from_hf",
    "build_model",
    "convert_hf_to_megatron",
    "destroy_distributed",
    "export_megatron_to_hf",
    "init_distributed",
    "iter_hf_weights",
    "load_hf_into_megatron",
    "load_megatron_checkpoint",
    "read_config",
    "save_hf_checkpoint",
]
