"""Cost of each sandbox isolation mode: one command, and one session start, per mode.

For ``bubblewrap`` and ``pod`` (and, as the floor, ``none``: rlimits only), the median wall time
of ``exec(["true"])`` (the fixed cost of a command), of ``exec(["python3", "-c", "pass"])`` (what
a test command pays on top of the interpreter), and of creating plus closing a session with one
small file (a session start). The modes alternate in rounds within one process, so background
load on a shared machine affects all of them alike.

    .venv/bin/python bench/isolation.py [--runs N] [--rounds R] [--out bench/results/isolation.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.podjail import check
from gagar.sandbox.types import Limits

MODES = {"bubblewrap": "bwrap", "pod": "pod", "none": "none"}
PROBES = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _round(factory: LocalFactory, runs: int, out: dict[str, list[float]]) -> None:
    with factory.create(files={"a.py": "X = 1\n"}) as s:
        for name, argv in PROBES.items():
            for _ in range(runs):
                out[name].append(_timed(lambda a=argv: s.exec(a)))
    for _ in range(runs):
        out["session start"].append(
            _timed(lambda: factory.create(files={"a.py": "X = 1\n"}).close())
        )


def measure(runs: int, rounds: int) -> dict[str, dict[str, float]]:
    check_isolation()
    check()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "isolation is OFF": the floor, on purpose
        factories = {m: LocalFactory(Limits(), isolation=b) for m, b in MODES.items()}  # type: ignore[arg-type]
    samples = {m: {k: [] for k in [*PROBES, "session start"]} for m in MODES}
    for _ in range(rounds):
        for mode, factory in factories.items():
            _round(factory, runs, samples[mode])
    return {
        mode: {k: round(statistics.median(v) * 1000, 1) for k, v in by.items()}
        for mode, by in samples.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="samples per probe per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/results/isolation.json")
    args = ap.parse_args()
    result = measure(args.runs, args.rounds)
    header = ["mode", *PROBES, "session start"]
    print("| " + " | ".join(header) + " |  (median ms)")
    print("|" + "---|" * len(header))
    for mode, by in result.items():
        print(f"| {mode} | " + " | ".join(f"{by[k]:.1f}" for k in header[1:]) + " |")
    meta = {"runs": args.runs, "rounds": args.rounds, "machine": platform.platform()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"median_ms": result, **meta}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
