"""Sandbox throughput: test executions per second, jailed vs. unisolated, at 1, 2 and 4 sessions.

Each worker owns one session (or, unisolated, one plain directory with the same files) and runs
the same command back to back. The jailed and unisolated runs alternate per concurrency level in
the same process, so background load affects both alike. Commands: ``pytest`` (a synthetic task's
visible tests, the executor's real workload) and ``true`` (the fixed cost of a jail).

Unisolated commands also start a new session (``setsid``), as bubblewrap's ``--new-session``
does: with ``sched_autogroup`` on, a new session is its own scheduling group, and on a shared,
loaded machine that alone made jailed runs look up to 2x *faster* than unisolated ones.

    .venv/bin/python bench/sandbox.py [--runs N] [--out bench/results/sandbox.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gagar.rollout.envs import synthetic
from gagar.sandbox import bwrap
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits

COMMANDS = {
    "pytest": "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider",
    "true": "true",
}


def _plain_runner(files: dict[str, bytes]):
    root = Path(tempfile.mkdtemp(prefix="gagar-bench-"))
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    env = bwrap.sandbox_env([os.path.dirname(sys.executable)], None)
    env["HOME"] = env["TMPDIR"] = str(root)

    def run(cmd: str) -> bool:
        p = subprocess.run(
            cmd, shell=True, cwd=root, env=env, capture_output=True, start_new_session=True
        )
        return p.returncode == 0

    return run, lambda: subprocess.run(["rm", "-rf", str(root)], check=False)


def _jailed_runner(factory: LocalFactory, files: dict[str, bytes]):
    session = factory.create(files=files)
    return (lambda cmd: session.exec(cmd).ok), session.close


def _timed(make, cmd: str, workers: int, runs: int) -> float:
    """Seconds for ``workers`` threads, each with its own runner, to run ``cmd`` ``runs`` times."""
    runners = [make() for _ in range(workers)]
    failures: list[str] = []

    def work(run) -> None:
        for _ in range(runs):
            if not run(cmd):
                failures.append(cmd)

    threads = [threading.Thread(target=work, args=(r,)) for r, _ in runners]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for _, close in runners:
        close()
    if failures:
        raise RuntimeError(f"{len(failures)} runs of {cmd!r} failed")
    return elapsed


def _compare(files, factory, cmd: str, workers: int, runs: int, rounds: int) -> tuple[float, float]:
    """Rates (runs/s) unisolated and jailed, alternating in short rounds so drift hits both."""
    plain = jailed = 0.0
    for _ in range(rounds):
        plain += _timed(lambda: _plain_runner(files), cmd, workers, runs)
        jailed += _timed(lambda: _jailed_runner(factory, files), cmd, workers, runs)
    total = workers * runs * rounds
    return total / plain, total / jailed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per worker per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--out", default="bench/results/sandbox.json")
    args = ap.parse_args()
    check_isolation()
    load_start = os.getloadavg()
    files = synthetic.generate(3).repo_files()
    factory = LocalFactory(limits=Limits(wall_time_s=120, cpu_time_s=60))
    rows = []
    for name, cmd in COMMANDS.items():
        runs = args.runs * (5 if name == "true" else 1)
        for workers in (1, 2, 4):
            plain, jailed = _compare(files, factory, cmd, workers, runs, args.rounds)
            rows.append(
                {
                    "command": name,
                    "sessions": workers,
                    "unisolated_per_s": round(plain, 2),
                    "sandboxed_per_s": round(jailed, 2),
                    "ratio": round(jailed / plain, 3),
                }
            )
            r = rows[-1]
            print(
                f"{name:<8}{workers:>9}{r['unisolated_per_s']:>16.2f}{r['sandboxed_per_s']:>15.2f}{r['ratio']:>8.3f}",
                flush=True,
            )
    result = {
        "benchmark": "sandbox",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "runs_per_worker_per_round": args.runs,
        "rounds": args.rounds,
        "load_avg_at_start": load_start,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    print(f"{'command':<8}{'sessions':>9}{'unisolated/s':>16}{'sandboxed/s':>15}{'ratio':>8}")
    sys.exit(main())
