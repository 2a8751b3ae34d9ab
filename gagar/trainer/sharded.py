"""Layout-independent checkpoints of the policy and its optimizer: Megatron-Core ``dist_checkpointing``.

Each rank describes its shard of every tensor as a ``ShardedTensor`` (the model's own
``sharded_state_dict``: where the shard sits in the global tensor, and which data-parallel copy
is the one to write), and the optimizer's moments mirror their parameter's sharding
(``make_sharded_optimizer_tensor`` under ``optimizer.state.<exp_avg|exp_avg_sq>.<key>``). The
``torch_dist`` strategy writes each global tensor's shards once; a job of any other tensor,
expert or data-parallel layout reads back the slices its own shards cover. The frozen KL
reference, when there is one, is saved the same way under ``reference.``. AdamW's step count and
hyperparameters, the same on every rank, are the common (unsharded) part.

The files (``metadata.json``, ``common.pt``, ``.metadata``, ``__<rank>_<n>.distcp``) sit in the
checkpoint directory next to the per-rank RNG parts, so the manifest's sizes and checksums cover
them. Loading runs no code from the files (the ``weights_only`` promise of ``checkpoint``):
``.metadata`` is a pickle, which ``check_safe`` reads with an unpickler that knows only the
classes torch's checkpoint metadata is made of; a checkpoint that stores pickled objects
(``ShardedObject``, which torch would unpickle freely) is refused; ``common.pt`` is read
``weights_only``. The optimizer is the learner's hand-written ``torch.optim.AdamW`` (its state is
created at zero before a load, so a fresh optimizer has tensors to load into).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from itertools import chain
from pathlib import Path
from typing import Any

import torch

from gagar.trainer.checkpoint import CheckpointError

FORMAT = "megatron-dist"
METADATA = ".metadata"  # torch.distributed.checkpoint's global plan (a pickle)
OWN_FILES = ("metadata.json", "common.pt", METADATA)  # and the ``*.distcp`` data files
_MOMENTS = ("exp_avg", "exp_avg_sq")


def dist_files(path: Path) -> list[Path]:
    """The files ``dist_checkpointing.save`` wrote into ``path``."""
    return sorted(p for p in path.iterdir() if p.name in OWN_FILES or p.suffix == ".distcp")


def records(path: Path) -> dict[str, dict[str, Any]]:
    """Manifest records (size, SHA-256) of the sharded files in ``path``, fsync'ed first."""
    out = {}
    for file in dist_files(path):
        with open(file, "rb") as fh:
            data = fh.read()
            os.fsync(fh.fileno())
        out[file.name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return out


def _init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Zero moments for parameters AdamW has not stepped yet (a load needs tensors to fill)."""
    for p in chain.from_iterable(g["params"] for g in optimizer.param_groups):
        if not optimizer.state[p]:
            optimizer.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def _optimizer_sharded(optimizer: torch.optim.Optimizer, model_sd: dict[str, Any]) -> dict:
    """AdamW's state with each moment a ``ShardedTensor`` shaped like its parameter's."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    _init_adam_state(optimizer)
    state = optimizer.state_dict()
    if any(set(s) != {"step", *_MOMENTS} for s in state["state"].values()):
        raise TypeError("the sharded checkpoint knows AdamW's state (step, exp_avg, exp_avg_sq)")
    steps = {float(s["step"]) for s in state["state"].values()}
    if len(steps) > 1:  # the learner steps every parameter together
        raise ValueError(f"AdamW parameters at different step counts: {sorted(steps)}")
    params = chain.from_iterable(g["params"] for g in optimizer.param_groups)
    id_map = get_param_id_to_sharded_param_map(model_sd, params)
    optim_state_to_sharding_state(state, id_map, exclude_keys=("step",))
    state["adam_step"] = steps.pop() if steps else 0.0
    return state


def model_sharded(model: Any, prefix: str = "") -> dict[str, Any]:
    """``model.sharded_state_dict`` without the layers' ``_extra_state``: Transformer Engine's
    (FP8 scaling) slot, always None in the local layers used here, and a pickled object in the
    checkpoint (``ShardedObject``) that loading would have to unpickle."""
    return {
        k: v for k, v in model.sharded_state_dict(prefix=prefix).items()
        if not k.endswith("._extra_state")
    }  # fmt: skip


def _with_extra_state(model: Any, state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``state`` (keys without ``prefix``) plus the ``_extra_state`` slots ``model`` expects."""
    out = {k.removeprefix(prefix): v for k, v in state.items()}
    return {**{k: None for k in model.state_dict() if k.endswith("._extra_state")}, **out}


def sharded_state(model: Any, optimizer: torch.optim.Optimizer, reference: Any = None) -> dict:
    """This rank's sharded state dict: ``model``, ``optimizer`` and (optional) ``reference``."""
    model_sd = model_sharded(model)
    out = {"model": model_sd, "optimizer": _optimizer_sharded(optimizer, model_sd)}
    if reference is not None:
        out["reference"] = model_sharded(reference, prefix="reference.")
    return out


def save(path: Path, model: Any, optimizer: torch.optim.Optimizer, reference: Any = None) -> None:
    """Collective: every rank writes its shards into ``path`` (an existing empty directory)."""
    from megatron.core import dist_checkpointing

    dist_checkpointing.save(sharded_state(model, optimizer, reference), str(path))


def load(path: Path, model: Any, optimizer: torch.optim.Optimizer, reference: Any = None) -> None:
    """Collective: fill this rank's shards of ``model``, ``optimizer`` and ``reference`` from
    the checkpoint at ``path``, whatever layout wrote it."""
    from megatron.core import dist_checkpointing

    check_safe(path)
    template = sharded_state(model, optimizer, reference)
    try:
        loaded = dist_checkpointing.load(template, str(path))
    except Exception as err:  # CheckpointingException, KeyError, shape mismatches: a bad checkpoint
        raise CheckpointError(f"{path}: cannot load: {type(err).__name__}: {err}") from err
    model.load_state_dict(_with_extra_state(model, loaded["model"]))
    if reference is not None:
        reference.load_state_dict(_with_extra_state(reference, loaded["reference"], "reference."))
    _load_optimizer(optimizer, loaded["optimizer"])


def _load_optimizer(optimizer: torch.optim.Optimizer, loaded: dict[str, Any]) -> None:
    step = torch.tensor(float(loaded["adam_step"]))
    state = {
        pid: {"step": step.clone(), **{k: v for k, v in moments.items() if k in _MOMENTS}}
        for pid, moments in loaded["state"].items()
    }
    groups = loaded["param_groups"]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def load_model(path: Path, model: Any) -> None:
    """Collective: only the policy's weights (e.g. to export a checkpoint to HF)."""
    from megatron.core import dist_checkpointing

    check_safe(path)
    try:
        loaded = dist_checkpointing.load({"model": model_sharded(model)}, str(path))
    except Exception as err:
        raise CheckpointError(f"{path}: cannot load: {type(err).__name__}: {err}") from err
    model.load_state_dict(_with_extra_state(model, loaded["model"]))


# What torch.distributed.checkpoint's metadata pickle is made of (its dataclasses, torch.Size, dtype
# and layout constants); naming anything else is refused.
_DCP = "torch.distributed.checkpoint"
_SAFE_GLOBALS = {
    (f"{_DCP}.metadata", "Metadata"),
    (f"{_DCP}.metadata", "MetadataIndex"),
    (f"{_DCP}.metadata", "TensorStorageMetadata"),
    (f"{_DCP}.metadata", "BytesStorageMetadata"),
    (f"{_DCP}.metadata", "ChunkStorageMetadata"),
    (f"{_DCP}.metadata", "TensorProperties"),
    (f"{_DCP}.metadata", "_MEM_FORMAT_ENCODING"),
    (f"{_DCP}.metadata", "StorageMeta"),
    (f"{_DCP}.planner", "SavePlan"),
    (f"{_DCP}.planner", "WriteItem"),
    (f"{_DCP}.planner", "WriteItemType"),
    (f"{_DCP}.planner", "TensorWriteData"),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a lookup among torch.layout constants
    ("torch", "Size"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        constant = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if not constant and (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata")
        return super().find_class(module, name)


def check_safe(path: Path) -> None:
    """Raise ``CheckpointError`` unless loading the checkpoint at ``path`` runs no stored code."""
    meta = path / METADATA
    try:
        metadata = _SafeUnpickler(io.BytesIO(meta.read_bytes())).load()
        torch.load(path / "common.pt", map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError, OSError, EOFError, ...
        raise CheckpointError(f"{path}: unsafe or unreadable: {type(err).__name__}: {err}") from err
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{meta}: not torch checkpoint metadata")
    items = metadata.state_dict_metadata.items()
    pickled = [k for k, v in items if isinstance(v, BytesStorageMetadata)]
    if pickled:  # torch unpickles these with weights_only=False
        raise CheckpointError(f"{path}: holds pickled objects ({', '.join(sorted(pickled)[:3])})")


def export_hf(path: Path, policy_dir: Path, out: Path) -> None:
    """Collective, at the current parallel layout: the policy of the checkpoint at ``path`` as an
    HF folder ``out`` (written by global rank 0; config and tokenizer from ``policy_dir``)."""
    from gagar.trainer.model import build_model, read_config, save_hf_checkpoint

    model = build_model(read_config(policy_dir))
    load_model(path, model)
    save_hf_checkpoint(model, out, policy_dir)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path`` whole, by its global key (``decoder.layers...``
    with the layers stacked first, ``optimizer.state.exp_avg.<key>``, ``reference.<key>``), in
    this one process: for inspection and tests, no process group needed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    check_safe(path)
    reader = dcp.FileSystemReader(str(path))
    items = reader.read_metadata().state_dict_metadata.items()
    out = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in items
        if isinstance(m, TensorStorageMetadata)
    }
    dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def export_checkpoint(step_dir: Path, policy_dir: Path, out: Path) -> Path:
    """``gagar model export-checkpoint``: in this one process (TP=1, whatever layout saved it),
    the verified checkpoint at ``step_dir`` as an HF folder ``out``."""
    import tempfile

    from gagar.trainer.checkpoint import CheckpointManager
    from gagar.trainer.model import Parallel, destroy_distributed, init_distributed

    CheckpointManager(step_dir.parent).verify(step_dir)
    if (step_dir / "state.json").exists() and not (step_dir / METADATA).exists():
        raise CheckpointError(f"{step_dir}: a per-rank checkpoint (resume it to convert it)")
    with tempfile.TemporaryDirectory() as tmp:
        init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{tmp}/rdzv")
        try:
            export_hf(step_dir, policy_dir, out)
        finally:
            destroy_distributed()
    return out
