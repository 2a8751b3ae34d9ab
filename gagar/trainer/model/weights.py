"""Weights in and out of a live (possibly sharded) Megatron ``GPTModel``.

``load_hf_into_megatron`` fills this rank's shard from an HF folder; ``iter_hf_weights`` gathers
the shards back into full HF tensors (tensor-parallel all-gather, expert-parallel all-gather,
pipeline stages broadcast in order). The gather is what weight sync to vLLM and HF export use.
Every rank of the job must call both (they are collectives).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gagar.trainer.model.arch import Arch, arch_from_hf
from gagar.trainer.model.hf_io import CheckpointError, HFReader, read_config
from gagar.trainer.model.mapping import (
    RankView,
    hf_to_megatron_rank,
    match_megatron,
    megatron_to_hf,
)

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def rank_view(arch: Arch) -> RankView:
    """The part of the model this process holds, from Megatron's parallel state."""
    from megatron.core import parallel_state as ps

    pp, stage = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    per_stage = arch.num_layers // pp
    return RankView(
        tp=ps.get_tensor_model_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        ep=ps.get_expert_model_parallel_world_size(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        layers=range(stage * per_stage, (stage + 1) * per_stage),
        first=ps.is_pipeline_first_stage(),
        last=ps.is_pipeline_last_stage(),
    )


def _rebase(name: str, offset: int) -> str:
    """Shift the layer index of a Megatron name (local <-> global for pipeline stages)."""
    return _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", name)


def model_arch(model: Any) -> Arch:
    arch = getattr(model, "gagar_arch", None)
    if arch is None:
        raise TypeError("model was not built by gagar.trainer.model.build_model")
    return arch


def load_state(model: Any, get_hf: Callable[[str], torch.Tensor]) -> None:
    """Copy this rank's shard, read through ``get_hf(hf_name)``, into ``model``'s parameters."""
    arch = model_arch(model)
    view = rank_view(arch)
    wanted = hf_to_megatron_rank(get_hf, arch, view)
    if arch.tie_embeddings and view.last and not view.first:
        # Tied output layer on a later pipeline stage: its own copy of the embedding shard.
        first = replace(view, layers=range(0), first=True, last=False)
        embedding = hf_to_megatron_rank(get_hf, arch, first)["embedding.word_embeddings.weight"]
        wanted["output_layer.weight"] = embedding
    offset = view.layers.start if view.layers is not None else 0
    params = dict(model.named_parameters())
    for local_name, param in params.items():
        name = _rebase(local_name, offset)
        if name not in wanted:
            raise CheckpointError(f"no weight for Megatron parameter {name!r}")
        tensor = wanted.pop(name)
        if tensor.shape != param.shape:
            raise CheckpointError(
                f"Megatron parameter {name!r}: shard shape {tuple(tensor.shape)} "
                f"!= model shape {tuple(param.shape)}"
            )
        with torch.no_grad():
            param.copy_(tensor)
    if wanted:
        raise CheckpointError(f"weight {next(iter(wanted))!r} has no parameter in the model")


def load_hf_into_megatron(model: Any, hf_dir: str | Path) -> None:
    """Load an HF checkpoint folder into this rank's shard of ``model`` (every rank calls it)."""
    arch = model_arch(model)
    cfg_arch = arch_from_hf(read_config(hf_dir))
    if cfg_arch != arch:
        raise CheckpointError(
            f"{hf_dir}: its config.json describes {cfg_arch}, the model is {arch}"
        )
    load_state(model, HFReader(hf_dir, arch).get)


def _all_gather(tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
    size = dist.get_world_size(group)
    if size == 1:
        return [tensor]
    out = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


def _stage_tensors(model: Any, arch: Arch) -> Iterator[tuple[str, torch.Tensor]]:
    """HF tensors of this pipeline stage, gathered over tensor and expert parallelism."""
    from megatron.core import parallel_state as ps

    view = rank_view(arch)
    offset = view.layers.start if view.layers is not None else 0
    for local_name, param in model.named_parameters():
        name = _rebase(local_name, offset)
        if name == "output_layer.weight" and arch.tie_embeddings:
            continue  # HF ties it to embed_tokens
        rule = match_megatron(name)[0]
        expert = rule.scope == "expert"
        tp_group = (ps.get_expert_tensor_parallel_group() if expert
                    else ps.get_tensor_model_parallel_group())  # fmt: skip
        shards = (
            _all_gather(param.detach(), tp_group) if rule.split is not None else [param.detach()]
        )
        if not expert:
            yield from megatron_to_hf(name, shards, arch, 0, 1)
            continue
        per_ep = _all_gather_list(shards, ps.get_expert_model_parallel_group())
        for ep_rank, ep_shards in enumerate(per_ep):
            yield from megatron_to_hf(name, ep_shards, arch, ep_rank, len(per_ep))


def _all_gather_list(shards: list[torch.Tensor], group: Any) -> list[list[torch.Tensor]]:
    """All-gather each of ``shards`` over ``group``: result[rank][i] is rank's shard i."""
    gathered = [_all_gather(s.detach(), group) for s in shards]
    return [list(per_rank) for per_rank in zip(*gathered, strict=True)]


def _broadcast_stage(items: list[tuple[str, torch.Tensor]], src: int, group: Any) -> list:
    """Send one pipeline stage's HF tensors to every stage (names first, then tensors)."""
    meta = [[(n, tuple(t.shape), t.dtype) for n, t in items]]
    dist.broadcast_object_list(meta, src=src, group=group)
    out = []
    device = items[0][1].device if items else _device()
    for i, (name, shape, dtype) in enumerate(meta[0]):
        t = items[i][1].contiguous() if items else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(t, src=src, group=group)
        out.append((name, t))
    return out


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def iter_hf_weights(model: Any, all_ranks: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` for the whole model, gathered across TP/EP/PP.

    Every rank must exhaust the iterator (it runs collectives). Global rank 0 receives every
    tensor; other ranks receive them too when ``all_ranks``, otherwise they yield nothing.
    Tensors are fresh or detached views: copy them before mutating the model.
    """
    from megatron.core import parallel_state as ps

    arch = model_arch(model)
    pp = ps.get_pipeline_model_parallel_world_size()
    receive = all_ranks or dist.get_rank() == 0
    if pp == 1:
        for item in _stage_tensors(model, arch):
            if receive:
                yield item
        return
    group = ps.get_pipeline_model_parallel_group()
    mine = list(_stage_tensors(model, arch))
    stage_ranks = dist.get_process_group_ranks(group)
    for stage, src in enumerate(stage_ranks):
        items = mine if stage == ps.get_pipeline_model_parallel_rank() else []
        received = _broadcast_stage(items, src, group)
        if receive:
            yield from received


def save_hf_checkpoint(model: Any, out_dir: str | Path, side_files_from: str | Path) -> None:
    """Write the gathered model as an HF folder on global rank 0 (every rank must call this).

    Config and tokenizer files are copied from ``side_files_from`` (the policy's HF folder).
    """
    from gagar.trainer.model.hf_io import copy_side_files, write_hf_weights

    tensors = list(iter_hf_weights(model))
    if dist.get_rank() == 0:
        copy_side_files(side_files_from, out_dir)
        write_hf_weights(out_dir, tensors)
