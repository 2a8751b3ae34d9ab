"""The trainer's compute dtype: what ``spec.model.dtype`` asks for, resolved on this machine.

Parameters stay float32 everywhere the trainer runs; the dtype chosen here is the autocast dtype
of the forward and backward (float32: no autocast). A low-precision dtype pays only where the
hardware computes it: on a CPU with AMX or AVX512-BF16 a bfloat16 matmul runs 2-4x faster than
float32, on one without (AVX2 only, e.g. AMD Zen 3) oneDNN has no bfloat16 kernel and PyTorch
falls back to converting every element, measured there at 37x *slower* than float32. So
``auto`` (the default) takes bfloat16 only where the CPU computes it natively, and an explicit
low-precision dtype the CPU can only emulate gets a warning with the measured cost.

What the CPU computes is read from torch (cpuinfo's flags) and then lowered by the masks a user
sets to test another kind of CPU: ``ONEDNN_MAX_CPU_ISA`` caps oneDNN's kernels (AVX2 leaves no
bfloat16 dot product), ``ATEN_CPU_CAPABILITY`` caps ATen's vectorized kernels.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from gagar.machine import cpu_name

Requested = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["cpu", "cuda"]

# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) in the order oneDNN ranks them, and the first of them
# with each low-precision dot product; a name not listed here (ALL, DEFAULT, a future one) caps
# nothing. AVX2_VNNI_2 only converts bfloat16, it does not multiply it.
_ONEDNN_ISAS = (
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX",
    "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16",
)  # fmt: skip
_ONEDNN_FIRST = {"bfloat16": "AVX512_CORE_BF16", "float16": "AVX512_CORE_FP16"}
# ATen's vectorized kernels below AVX-512 have no bfloat16/float16 arithmetic of their own
_ATEN_LOW = ("default", "avx2")


@dataclass(frozen=True)
class Precision:
    """The resolved compute dtype and why: ``dtype`` is what the trainer autocasts to
    (``float32``: no autocast), ``reason`` is the sentence the log and the summary print."""

    requested: str
    dtype: str
    device: str
    reason: str

    @property
    def autocast(self) -> torch.dtype | None:
        return None if self.dtype == "float32" else getattr(torch, self.dtype)

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def cpu_features() -> dict[str, bool | str]:
    """The vector capabilities torch sees on this CPU, and the masks in force (bench records and
    the reason strings quote them)."""
    cpu = torch.cpu
    return {
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "avx2": bool(cpu._is_avx2_supported()),
        "avx512": bool(cpu._is_avx512_supported()),
        "avx512_vnni": bool(cpu._is_vnni_supported()),
        "avx512_bf16": bool(cpu._is_avx512_bf16_supported()),
        "amx_tile": bool(cpu._is_amx_tile_supported()),
        "amx_fp16": bool(cpu._is_amx_fp16_supported()),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", ""),
    }


def _mask(dtype: str) -> str | None:
    """The environment variable that keeps ``dtype``'s native kernels off, with its value."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa in _ONEDNN_ISAS and _ONEDNN_ISAS.index(isa) < _ONEDNN_ISAS.index(_ONEDNN_FIRST[dtype]):
        return f"ONEDNN_MAX_CPU_ISA={isa}"
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in _ATEN_LOW:
        return f"ATEN_CPU_CAPABILITY={aten}"
    return None


def cpu_native(dtype: str) -> tuple[bool, str]:
    """Whether this CPU computes ``dtype`` (bfloat16 or float16) natively, and the evidence."""
    f = cpu_features()
    if dtype == "bfloat16":
        units = [n for n, k in (("AMX", "amx_tile"), ("AVX512-BF16", "avx512_bf16")) if f[k]]
        wanted = "AMX or AVX512-BF16"
    else:
        units = ["AMX-FP16"] if f["amx_fp16"] else []
        wanted = "AMX-FP16"
    if not units:
        return False, f"the CPU has no {wanted} (torch sees {f['aten_capability']})"
    mask = _mask(dtype)
    if mask is not None:
        return False, f"the CPU's {' and '.join(units)} are masked by {mask}"
    return True, f"the CPU computes {dtype} natively ({' and '.join(units)})"


def trainer_device(device: str) -> str:
    """``spec.trainer.device`` as the trainer resolves it: ``auto`` is cuda where one is visible."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve(requested: str, device: str) -> Precision:
    """``spec.model.dtype`` on ``device`` (``cpu`` or ``cuda``, as the trainer resolved it)."""
    if device == "cuda":
        if requested != "auto":
            return Precision(requested, requested, device, f"{requested} as the spec asks")
        if torch.cuda.is_bf16_supported():
            return Precision(requested, "bfloat16", device, "auto: the GPU computes bfloat16")
        # float16 would need loss scaling, which the learner does not do
        return Precision(requested, "float32", device, "auto: the GPU has no bfloat16")
    if requested == "float32":
        return Precision(requested, "float32", device, "float32 as the spec asks")
    if requested == "auto":
        native, why = cpu_native("bfloat16")
        return Precision(requested, "bfloat16" if native else "float32", device, f"auto: {why}")
    native, why = cpu_native(requested)
    return Precision(requested, requested, device, f"{requested} as the spec asks; {why}")


def emulation_cost(dtype: str, size: int = 512, repeats: int = 2) -> float:
    """Measured here: how many times slower an autocast ``dtype`` matmul of ``size``³ runs than
    the float32 one (the best of ``repeats`` each, after a warm-up; under a second in all where
    ``dtype`` is emulated: 0.24 s a matmul against 6.5 ms on AVX2). At 256³ the ratio is only
    about 5 and noisy: the emulation's cost grows with the size."""
    a, b = torch.randn(size, size), torch.randn(size, size)

    def best(ctx: torch.dtype | None) -> float:
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            if ctx is None:
                a @ b
            else:
                with torch.autocast("cpu", dtype=ctx):
                    a @ b
            times.append(time.perf_counter() - t0)
        return min(times[1:])

    return best(getattr(torch, dtype)) / max(best(None), 1e-9)


def warning(p: Precision) -> str | None:
    """The warning for an explicit low-precision dtype this CPU can only emulate, with its
    measured cost; None where the choice costs nothing."""
    if p.device != "cpu" or p.requested in ("auto", "float32") or cpu_native(p.dtype)[0]:
        return None
    cost = emulation_cost(p.dtype)
    return (
        f"spec.model.dtype {p.dtype}: {p.reason}, so torch emulates it — a {p.dtype} matmul "
        f"measured {cost:.0f}x slower than float32 here ({cpu_name()}); use dtype: auto "
        "(bfloat16 only where the CPU computes it) or float32"
    )
