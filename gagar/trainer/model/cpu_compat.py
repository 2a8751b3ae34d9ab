"""Megatron-Core on a machine without a GPU: every CPU workaround lives here and nowhere else.

Megatron-Core 0.16 assumes CUDA in a handful of places even when the model is built with
``use_cpu_initialization=True``. Running on the CPU with the gloo backend needs:

1. ``torch.cuda.current_device`` returns ``"cpu"``: Megatron places buffers (global memory buffer,
   RoPE inverse frequencies, MoE router and dispatcher temporaries) on
   ``torch.cuda.current_device()``; on a CPU build of torch that call raises.
2. ``get_default_causal_mask`` builds the causal mask on the CPU (upstream hard-codes ``"cuda"``).
3. ``CudaRNGStatesTracker`` is replaced by a tracker over the CPU generator, so dropout regions
   forked by tensor/expert-parallel code keep their own reproducible streams.
4. ``moe_utils.te_general_gemm`` is defined as ``None``: without Transformer Engine the name is
   never bound, and the router's gating GEMM reads it unconditionally.
5. ``torch.cuda.manual_seed`` is a no-op: ``model_parallel_cuda_manual_seed`` calls it.
6. ``torch.cuda.synchronize`` is a no-op (nothing runs asynchronously without a GPU):
   ``dist_checkpointing``'s writer waits on it after copying tensors to the host.

Limits measured with 0.16.1: the ``alltoall`` MoE token dispatcher needs CUDA streams (use
``allgather``); tensor parallelism with MoE requires sequence parallelism, which the plain-torch
norm refuses, so MoE runs with TP=1 and EP>1 on the CPU.

The patches are applied only when ``torch.cuda.is_available()`` is false, and only for the
Megatron-Core versions in ``SUPPORTED_VERSIONS``: an unknown version raises unless
``GAGAR_ALLOW_UNTESTED_MEGATRON=1``. ``PATCHED_SOURCES`` fingerprints the upstream functions each
patch replaces or relies on; ``tests/unit/test_model_cpu_compat.py`` fails when a release changes
any of them, which is the signal to re-check this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

SUPPORTED_VERSIONS = ("0.16.1",)
OVERRIDE_ENV = "GAGAR_ALLOW_UNTESTED_MEGATRON"

# "module:qualname" -> sha256 (first 16 hex digits) of the upstream source in 0.16.1.
PATCHED_SOURCES = {
    "megatron.core.transformer.utils:get_default_causal_mask": "4638b2c6665fc284",
    "megatron.core.fusions.fused_softmax:FusedScaleMaskSoftmax.forward_torch_softmax": "af74f78c0020665e",
    "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.fork": "6821e1e397253d43",
    "megatron.core.tensor_parallel.random:CudaRNGStatesTracker.add": "e5e9ab39a7c1e085",
    "megatron.core.tensor_parallel.random:initialize_rng_tracker": "4bc461df7c7f7a43",
    "megatron.core.tensor_parallel.random:model_parallel_cuda_manual_seed": "7423a4a62741adea",
    "megatron.core.transformer.moe.moe_utils:RouterGatingLinearFunction.forward": "dcba4f9f02b30a36",
    "megatron.core.utils:GlobalMemoryBuffer.get_tensor": "2b843a83eb762098",
    "megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.get_emb": "d36bc7732392e419",
    "megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync.preload_tensors": "df5b267188bbfd77",
}

_applied = False
# Upstream objects as they were before ``apply`` replaced them (fingerprints read these).
_originals: dict[str, object] = {}


def megatron_version() -> str:
    import megatron.core

    return str(megatron.core.__version__)


def check_version() -> None:
    """Refuse to patch a Megatron-Core release this module was not written for."""
    version = megatron_version()
    if version in SUPPORTED_VERSIONS or os.environ.get(OVERRIDE_ENV) == "1":
        return
    raise RuntimeError(
        f"gagar's CPU compatibility layer was written for megatron-core {SUPPORTED_VERSIONS}, "
        f"found {version}. Re-check gagar/trainer/model/cpu_compat.py against the new release "
        f"(run tests/unit/test_model_cpu_compat.py) or set {OVERRIDE_ENV}=1 to try anyway."
    )


def source_fingerprint(target: str) -> str:
    """sha256 prefix of the source of ``module:Qual.name`` (what a patch depends on)."""
    module_name, qualname = target.split(":")
    head, _, rest = qualname.partition(".")
    obj: Any = _originals.get(f"{module_name}:{head}") or getattr(
        importlib.import_module(module_name), head
    )
    for part in rest.split(".") if rest else []:
        obj = getattr(obj, part)
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    """Upper-triangular causal mask, on the CPU."""
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _make_cpu_tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Named RNG streams over the CPU generator (the one CPU dropout draws from)."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise RuntimeError(f"seed {seed} already exists")
            if name in self.states_:
                raise RuntimeError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise RuntimeError(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def _cpu_current_device() -> str:
    return "cpu"


def changed_sources() -> list[str]:
    """Patched upstream functions whose source differs from the version this was written for."""
    return [t for t, h in PATCHED_SOURCES.items() if source_fingerprint(t) != h]


def apply(force: bool = False) -> bool:
    """Patch Megatron-Core for the CPU when there is no GPU. Idempotent; returns whether applied."""
    global _applied
    if _applied:
        return True
    if torch.cuda.is_available() and not force:
        return False
    check_version()
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer import utils as tutils
    from megatron.core.transformer.moe import moe_utils

    if megatron_version() not in SUPPORTED_VERSIONS and changed_sources():
        warnings.warn(
            f"megatron-core sources changed under the CPU patches: {changed_sources()}",
            stacklevel=2,
        )
    _originals["megatron.core.transformer.utils:get_default_causal_mask"] = (
        tutils.get_default_causal_mask
    )
    _originals["megatron.core.tensor_parallel.random:CudaRNGStatesTracker"] = (
        mrandom.CudaRNGStatesTracker
    )
    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.synchronize = lambda device=None: None
    tutils.get_default_causal_mask = _cpu_causal_mask
    fused_softmax.get_default_causal_mask = _cpu_causal_mask
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    mrandom.CudaRNGStatesTracker = _make_cpu_tracker_class()
    mrandom.initialize_rng_tracker(force_reset=True)
    _applied = True
    return True


def is_applied() -> bool:
    return _applied
