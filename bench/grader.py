"""Heuristic grader latency per group size: prints a table, writes bench/results/grader.json.

Every call starts cold (``rank`` keeps no state between calls). Groups come from ``gagar.grader.sample.scaled_group`` (clean, bloated, tampered, failing and
special-cased candidates in rotation on a small repository). Run: ``.venv/bin/python bench/grader.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.grader.heuristic import rank
from gagar.grader.sample import scaled_group

SIZES = (2, 4, 8, 16, 32)


def measure(size: int, repeats: int) -> dict:
    group = scaled_group(size)
    rank(group)  # warm-up (imports, caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        rank(group)
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "group_size": size,
        "repeats": repeats,
        "median_seconds": statistics.median(times),
        "p90_seconds": times[min(len(times) - 1, int(0.9 * len(times)))],
        "min_seconds": times[0],
        "per_candidate_ms": 1000 * statistics.median(times) / size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "grader.json"))
    args = parser.parse_args()
    rows = [measure(size, args.repeats) for size in SIZES]
    print(f"{'group size':>10} {'median ms':>10} {'p90 ms':>8} {'min ms':>8} {'ms/cand':>8}")
    for r in rows:
        print(
            f"{r['group_size']:>10} {1000 * r['median_seconds']:>10.1f} {1000 * r['p90_seconds']:>8.1f} {1000 * r['min_seconds']:>8.1f} {r['per_candidate_ms']:>8.2f}"
        )
    meta = {"python": platform.python_version(), "cpus": os.cpu_count()}
    save(
        args.out, {"benchmark": "heuristic_grader_latency", "meta": meta, "results": rows}, indent=2
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
