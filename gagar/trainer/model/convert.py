"""Offline conversion between HF folders and gagar's sharded Megatron folders (no process groups).

A Megatron folder holds the HF ``config.json`` and tokenizer files unchanged, ``megatron.json``
(format, tp, ep, family) and one safetensors file per (tensor-parallel rank, expert-parallel rank):
``tp{t:02d}_ep{e:02d}.safetensors`` with Megatron parameter names (global layer indices, local
expert indices). Files with ``e > 0`` hold only expert tensors, since everything else is
replicated across expert-parallel ranks. Pipeline stages are cut at load time, so the same
folder serves any pipeline size.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gagar.trainer.model.arch import Arch, arch_from_hf
from gagar.trainer.model.hf_io import (
    CheckpointError,
    HFReader,
    copy_side_files,
    read_config,
    write_hf_weights,
)
from gagar.trainer.model.mapping import (
    RankView,
    check_layout,
    hf_to_megatron_rank,
    match_megatron,
    megatron_to_hf,
)

FORMAT = "gagar-megatron/1"
META = "megatron.json"


@dataclass(frozen=True)
class MegatronMeta:
    tp: int
    ep: int
    family: str

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "tp": self.tp, "ep": self.ep, "family": self.family})


def shard_file(folder: str | Path, tp_rank: int, ep_rank: int) -> Path:
    return Path(folder) / f"tp{tp_rank:02d}_ep{ep_rank:02d}.safetensors"


def read_meta(folder: str | Path) -> MegatronMeta:
    path = Path(folder) / META
    if not path.is_file():
        raise CheckpointError(f"{folder}: {META} is missing (not a gagar Megatron folder)")
    raw = json.loads(path.read_text())
    if raw.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {raw.get('format')!r}, expected {FORMAT!r}")
    return MegatronMeta(int(raw["tp"]), int(raw["ep"]), str(raw["family"]))


def _is_expert(name: str) -> bool:
    return match_megatron(name)[0].scope == "expert"


def convert_hf_to_megatron(
    hf_dir: str | Path, out_dir: str | Path, tp: int = 1, ep: int = 1
) -> MegatronMeta:
    """Shard an HF checkpoint folder for ``tp`` x ``ep`` ranks."""
    config = read_config(hf_dir)
    arch = arch_from_hf(config)
    check_layout(arch, tp, ep)
    reader = HFReader(hf_dir, arch)
    out = Path(out_dir)
    copy_side_files(hf_dir, out)
    for e in range(ep):
        for t in range(tp):
            shard = hf_to_megatron_rank(reader.get, arch, RankView(tp, t, ep, e))
            if e > 0:
                shard = {k: v for k, v in shard.items() if _is_expert(k)}
            save_file(shard, str(shard_file(out, t, e)), metadata={"format": "pt"})
    meta = MegatronMeta(tp, ep, arch.family)
    (out / META).write_text(meta.to_json() + "\n")
    return meta


def _load_shard(folder: str | Path, tp_rank: int, ep_rank: int) -> dict[str, torch.Tensor]:
    path = shard_file(folder, tp_rank, ep_rank)
    if not path.is_file():
        raise CheckpointError(f"{folder}: shard file {path.name} is missing")
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def iter_megatron_folder(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """HF ``(name, tensor)`` pairs of a gagar Megatron folder (shards merged)."""
    meta = read_meta(folder)
    arch = arch_from_hf(read_config(folder))
    if arch.family != meta.family:
        raise CheckpointError(f"{folder}: {META} says {meta.family}, config.json {arch.family}")
    for e in range(meta.ep):
        shards = [_load_shard(folder, t, e) for t in range(meta.tp)]
        for name in shards[0]:
            if e > 0 and not _is_expert(name):
                continue
            parts = [_shard_tensor(s, name, folder, t) for t, s in enumerate(shards)]
            yield from megatron_to_hf(name, parts, arch, e, meta.ep)


def _shard_tensor(shard: dict[str, torch.Tensor], name: str, folder: Any, t: int) -> torch.Tensor:
    if name not in shard:
        raise CheckpointError(f"{folder}: tensor {name!r} is missing from tensor-parallel rank {t}")
    return shard[name]


def check_complete(tensors: dict[str, torch.Tensor], arch: Arch, where: str) -> None:
    """Every HF tensor of ``arch`` is there with its shape (reuses the HF reader's checks)."""
    from gagar.trainer.model.hf_io import hf_shape
    from gagar.trainer.model.mapping import hf_names

    for name in hf_names(arch):
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name!r} is missing")
        if tuple(tensors[name].shape) != hf_shape(name, arch):
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"expected {hf_shape(name, arch)}"
            )


def export_megatron_to_hf(folder: str | Path, hf_dir: str | Path) -> Path:
    """Merge a gagar Megatron folder into an HF folder that transformers and vLLM load."""
    arch = arch_from_hf(read_config(folder))
    tensors = dict(iter_megatron_folder(folder))
    check_complete(tensors, arch, str(folder))
    copy_side_files(folder, hf_dir)
    return write_hf_weights(hf_dir, tensors.items())


def load_megatron_checkpoint(model: Any, folder: str | Path) -> None:
    """Load a gagar Megatron folder into a live model, whatever the folder's TP/EP sizes.

    Reads the merged HF view and re-shards it for this rank, so a checkpoint written at one
    parallel layout loads at any other (the model is small enough, or this runs per rank).
    """
    from gagar.trainer.model.weights import load_state, model_arch

    arch = model_arch(model)
    if arch_from_hf(read_config(folder)) != arch:
        raise CheckpointError(f"{folder}: config.json does not describe the model being loaded")
    tensors = dict(iter_megatron_folder(folder))
    check_complete(tensors, arch, str(folder))
    load_state(model, tensors.__getitem__)
