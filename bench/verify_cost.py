"""CPU cost of one verification: today's verifier against an older revision's, alternating.

One verification is ``verify_files`` of a synthetic task's reference fix (a session from the
task's files, its archive into a fresh session or a station, the restore, the test run). Per
verification: the CPU of the test command's process tree in the jail (``ExecResult.cpu_time_s``,
from its cgroups: for a warm run the forked run, for a cold one the whole interpreter), the
executor's own CPU (``RUSAGE_SELF``: the archive, the restore, the judging), and the wall time;
station (warm, forked from a fork server) and cold (a fresh interpreter per run) alike. The
baseline is ``verify.py`` and ``verify_boot.py`` of ``--baseline`` (a git revision), loaded beside
today's; the two alternate within each round, so background load affects both alike.

    .venv/bin/python bench/verify_cost.py [--runs N] [--baseline REV] [--out FILE.json]

(``--out`` default: ``bench/results/verify-cost.json``.)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.rollout.envs import synthetic, verify
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits, SessionRequest, VerificationFactory

ROOT = Path(__file__).resolve().parents[1]


class _Metered:
    """A session whose commands' results are kept (``exec``); the rest passes through."""

    def __init__(self, session: Any, results: list) -> None:
        self._session, self._results = session, results

    def exec(self, cmd: Any, timeout: float | None = None) -> Any:
        result = self._session.exec(cmd, timeout)
        self._results.append(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class Metered(VerificationFactory):
    """``factory`` with every session metered: the jail CPU of each command is kept."""

    def __init__(self, factory: LocalFactory) -> None:
        self.factory, self.results = factory, []  # type: ignore[var-annotated]

    def open(self, request: SessionRequest) -> Any:
        return _Metered(self.factory.open(request), self.results)


def baseline(rev: str) -> Callable:
    """``verify_files`` of revision ``rev``: its verify.py, run with its own bootstrap."""
    show = lambda path: subprocess.run(  # noqa: E731
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, check=True
    ).stdout.decode()
    old_verify, old_boot = (
        show("gagar/rollout/envs/verify.py"),
        show("gagar/rollout/envs/verify_boot.py"),
    )
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(old_verify)
    spec = importlib.util.spec_from_file_location("gagar_verify_baseline", f.name)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # pydantic resolves names there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    os.unlink(f.name)
    module.BOOT_SOURCE = old_boot
    return module.verify_files


def _cpu_self() -> float:
    """The executor's own CPU (not its reaped children: a cold run's jail is one of them, and
    its CPU is counted already, from its cgroups)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def measure(runs: int, rev: str) -> list[dict[str, Any]]:
    task = synthetic.generate(5)
    files = task.fixed_files()
    variants = {"today": verify.verify_files, rev: baseline(rev)}
    rows = []
    for mode in ("station", "cold"):
        limits = Limits(wall_time_s=120, cpu_time_s=60)
        factory = Metered(LocalFactory(limits=limits, warm=mode == "station"))
        samples: dict[str, dict[str, list[float]]] = {
            v: {"wall": [], "jail": [], "host": []} for v in variants
        }
        for i in range(runs + 1):  # the first round warms the station up: not counted
            for name, fn in variants.items():
                factory.results.clear()
                cpu, t0 = _cpu_self(), time.perf_counter()
                verdict = fn(task, files, factory)
                wall, host = time.perf_counter() - t0, _cpu_self() - cpu
                assert verdict.passed, (name, verdict.notes, verdict.log[-500:])
                if i:
                    samples[name]["wall"].append(wall)
                    samples[name]["host"].append(host)
                    samples[name]["jail"].append(sum(r.cpu_time_s for r in factory.results))
        for name, s in samples.items():
            row = {k: round(statistics.median(v), 4) for k, v in s.items()}
            row["cpu"] = round(row["jail"] + row["host"], 4)
            rows.append({"mode": mode, "verifier": name, **row})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--baseline",
        default="c745351",
        help="git revision of the older verifier (default: the one before the witness process "
        "and the planted tests)",
    )
    ap.add_argument("--out", default="bench/results/verify-cost.json")
    args = ap.parse_args()
    check_isolation()
    load_start = os.getloadavg()
    rows = measure(args.runs, args.baseline)
    print(
        f"{'mode':<9}{'verifier':<14}{'jail CPU s':>11}{'host CPU s':>11}{'CPU s':>8}{'wall s':>8}"
    )
    for r in rows:
        print(
            f"{r['mode']:<9}{r['verifier']:<14}{r['jail']:>11.3f}{r['host']:>11.3f}"
            f"{r['cpu']:>8.3f}{r['wall']:>8.3f}"
        )
    result = {
        "benchmark": "verify-cost",
        "what": "median CPU and wall seconds per verification of a synthetic task's reference fix",
        "runs": args.runs,
        "baseline": args.baseline,
        "rows": rows,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
    }
    save(args.out, result, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
