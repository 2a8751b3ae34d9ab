"""Read and write Hugging Face-format checkpoint folders (config.json + safetensors + tokenizer).

Reading is checked at the boundary: a tensor that is missing, has the wrong shape, or does not
belong to the family (e.g. q/k/v biases in a Llama checkpoint, experts in a dense one) is an
error that names the tensor and the folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gagar.trainer.model.arch import Arch, arch_from_hf
from gagar.trainer.model.mapping import hf_names
from gagar.wire import HF_SIDE_FILES

# HF tensors that some checkpoints carry but that no model parameter corresponds to.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint folder is incomplete, corrupt or of another model."""


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: config.json is missing")
    return dict(json.loads(path.read_text()))


def hf_shape(name: str, arch: Arch) -> tuple[int, ...]:
    """The shape a tensor of this name must have in an HF checkpoint of ``arch``."""
    h, d, v = arch.hidden_size, arch.head_dim, arch.vocab_size
    q, kv = arch.num_heads * d, arch.num_kv_heads * d
    expert = ".experts." in name
    ffn = arch.moe_ffn_hidden_size if expert else arch.ffn_hidden_size
    table = {
        "embed_tokens.weight": (v, h),
        "lm_head.weight": (v, h),
        "norm.weight": (h,),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "q_proj.weight": (q, h),
        "k_proj.weight": (kv, h),
        "v_proj.weight": (kv, h),
        "o_proj.weight": (h, q),
        "q_norm.weight": (d,),
        "k_norm.weight": (d,),
        "gate_proj.weight": (ffn, h),
        "up_proj.weight": (ffn, h),
        "down_proj.weight": (h, ffn),
        "gate.weight": (arch.num_experts, h),
    }
    # a projection's bias (Qwen2's q, k and v) has one entry per output row of its weight
    table |= {f"{p}_proj.bias": table[f"{p}_proj.weight"][:1] for p in "qkv"}
    key = ".".join(name.split(".")[-2:])
    return table[key]


class HFReader:
    """Lazy, checked access to the tensors of an HF checkpoint folder."""

    def __init__(self, folder: str | Path, arch: Arch | None = None) -> None:
        self.folder = Path(folder)
        self.arch = arch or arch_from_hf(read_config(folder))
        self._where = self._index()
        self._check_names()

    def _index(self) -> dict[str, Path]:
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.folder}: no *.safetensors files")
        where: dict[str, Path] = {}
        for path in files:
            try:
                with safe_open(path, "pt") as f:
                    where.update(dict.fromkeys(f.keys(), path))
            except Exception as exc:
                raise CheckpointError(f"{path}: unreadable safetensors file ({exc})") from exc
        return where

    def _check_names(self) -> None:
        expected = set(hf_names(self.arch))
        extra = sorted(
            n for n in self._where if n not in expected and not n.endswith(IGNORED_SUFFIXES)
        )
        if extra:
            raise CheckpointError(
                f"{self.folder}: tensor {extra[0]!r} does not belong to a {self.arch.family} model "
                f"with this config ({len(extra)} unexpected tensors); wrong family or config?"
            )
        missing = [n for n in hf_names(self.arch) if n not in self._where]
        if missing:
            raise CheckpointError(
                f"{self.folder}: tensor {missing[0]!r} is missing ({len(missing)} missing in all)"
            )

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise CheckpointError(f"{self.folder}: tensor {name!r} is missing")
        with safe_open(self._where[name], "pt") as f:
            tensor = f.get_tensor(name)
        expected = hf_shape(name, self.arch)
        if tuple(tensor.shape) != expected:
            raise CheckpointError(
                f"{self.folder}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {expected} for this config"
            )
        return tensor


def copy_side_files(src: str | Path, dst: str | Path) -> None:
    """Copy config, tokenizer and generation files (whatever of them exists)."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    for name in HF_SIDE_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, Path(dst) / name)


def write_hf_weights(folder: str | Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """Write ``model.safetensors`` (contiguous copies; tied tensors are never written twice)."""
    out = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors}
    path = Path(folder) / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path), metadata={"format": "pt"})
    return path
