"""Benchmark: vectorized GAGAR advantages vs the per-group pure-Python reference, same run.

Times ``gar_advantages`` on G groups × n trajectories (default 4096 × 16, float32 and float64)
against ``tests/unit/gar_reference.py`` (the one reference copy, loaded by path), checks they
agree, prints a table and writes ``bench/results/advantages.json``.

    .venv/bin/python bench/advantages.py [--groups 4096] [--n 16] [--repeats 20] [--threads 1]

The machine's load average is recorded with the numbers: on a shared 2-core box, 2 torch threads
under load thrash, so the default is 1 thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.record import save  # noqa: E402
from gagar.trainer.gar import gar_advantages  # noqa: E402


def load_reference() -> ModuleType:
    path = ROOT / "tests" / "unit" / "gar_reference.py"
    spec = importlib.util.spec_from_file_location("gar_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gar_reference"] = module
    spec.loader.exec_module(module)
    return module


def make_inputs(groups: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    """Binary rewards with a per-group pass rate, 5% invalid, 2% hacks, 90% usable rankings."""
    gen = torch.Generator().manual_seed(seed)
    rate = torch.rand(groups, 1, generator=gen)
    passed = torch.rand(groups, n, generator=gen) < rate
    valid = torch.rand(groups, n, generator=gen) > 0.05
    hacks = passed & valid & (torch.rand(groups, n, generator=gen) < 0.02)
    levels = torch.tensor([1.0, 0.9, 0.85, 0.625, 0.4, 0.2], dtype=torch.float64)
    factors = levels[torch.randint(0, len(levels), (groups, n), generator=gen)]
    return {
        "rewards": passed.to(torch.float64),
        "passed": passed,
        "valid": valid,
        "factors": factors,
        "usable": torch.rand(groups, generator=gen) > 0.1,
        "hacks": hacks,
    }


def time_it(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def as_dtype(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}


def run(groups: int, n: int, repeats: int) -> dict[str, object]:
    ref = load_reference()
    inputs = make_inputs(groups, n, seed=0)
    ref_times = time_it(lambda: ref.gar_reference(**inputs), max(1, repeats // 10))
    ref_adv, _, _ = ref.gar_reference(**inputs)
    rows = []
    ref_median = statistics.median(ref_times)
    for dtype in (torch.float32, torch.float64):
        typed = as_dtype(inputs, dtype)
        times = time_it(lambda typed=typed: gar_advantages(**typed), repeats)
        diff = (gar_advantages(**typed).double() - ref_adv).abs().max().item()
        median = statistics.median(times)
        rows.append(
            {
                "impl": f"vectorized ({str(dtype).removeprefix('torch.')})",
                "median_s": median,
                "min_s": min(times),
                "repeats": repeats,
                "speedup_vs_reference": ref_median / median,
                "max_abs_diff_vs_reference": diff,
            }
        )
    rows.append(
        {
            "impl": "per-group reference (python)",
            "median_s": ref_median,
            "min_s": min(ref_times),
            "repeats": len(ref_times),
            "speedup_vs_reference": 1.0,
            "max_abs_diff_vs_reference": 0.0,
        }
    )
    return {
        "benchmark": "gar_advantages",
        "groups": groups,
        "n": n,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "rows": rows,
    }


def print_table(result: dict[str, object]) -> None:
    title = (
        f"gar_advantages, {result['groups']} groups × {result['n']}, {result['threads']} thread(s)"
    )
    table = Table(title=title)
    for col in ("impl", "median ms", "min ms", "repeats", "speed-up", "max |Δ| vs ref"):
        table.add_column(col, justify="left" if col == "impl" else "right")
    for row in result["rows"]:  # type: ignore[attr-defined]
        table.add_row(
            row["impl"],
            f"{row['median_s'] * 1e3:.2f}",
            f"{row['min_s'] * 1e3:.2f}",
            str(row["repeats"]),
            f"{row['speedup_vs_reference']:.1f}x",
            f"{row['max_abs_diff_vs_reference']:.1e}",
        )
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "advantages.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.groups, args.n, args.repeats)
    print_table(result)
    save(args.out, result, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
