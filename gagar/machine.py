"""What machine a measurement ran on: the CPU's model and the vector units it has.

Timings on this project's machines differ by the CPU more than by anything else: the same
2 cores are an Intel part with AMX on one machine and an AMD EPYC with AVX2 only on the next,
where bfloat16 is emulated (37x slower than float32) and float32 runs at half the width. Every
benchmark's JSON and every run's report carry this record, so a reader can tell which kind
of CPU a number came from (``gagar.trainer.precision`` decides the compute dtype from the same
units, as torch sees them).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags that decide how fast the trainer's and the engine's kernels run
VECTOR_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
)  # fmt: skip
MASKS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")  # set to test another kind of CPU


def _cpuinfo() -> dict[str, str]:
    """The first processor's ``/proc/cpuinfo`` fields (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends here
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name() -> str:
    """The CPU's model name, or the platform's word for it."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def vector_units() -> list[str]:
    """The ``VECTOR_FLAGS`` this CPU reports."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [f for f in VECTOR_FLAGS if f in flags]


def machine() -> dict[str, Any]:
    """The record a benchmark's JSON and a run's report keep: CPU model, vector units, the
    cores this process may use, the masks in force and, where torch is installed, the kernel
    level torch dispatches to."""
    record: dict[str, Any] = {
        "cpu": cpu_name(),
        "vector_units": vector_units(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "masks": {name: os.environ[name] for name in MASKS if name in os.environ},
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch
    except ImportError:
        return record
    record["torch"] = torch.__version__
    record["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return record
