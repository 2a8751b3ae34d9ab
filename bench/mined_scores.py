"""Scores of two fixed policies on the mined tasks, per package: one that changes nothing (the
unfixed snapshot, which must score 0) and the reference fixes (the released files, which must
score 1). Each is the real verifier's verdict (``verify_files``) with every listed test, the
held-back ones included, as evaluation runs them; a task scoring otherwise is a bad row.

    .venv/bin/python bench/mined_scores.py [--tasks runs/tasks/tasks.jsonl] [--per-package N]
        [--out bench/results/mined-scores.json]

``--per-package N``: the first N tasks of each package only (default: all).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.record import save
from gagar.rollout.envs.task import Task, load_tasks

Verifier = Callable[[Task, dict[str, bytes]], bool]  # passed?

POLICIES: dict[str, Callable[[Task], dict[str, bytes]]] = {
    "do_nothing": lambda task: task.repo_files(),
    "reference": lambda task: task.fixed_files(),
}


def score(tasks: list[Task], passes: Verifier) -> dict[str, Any]:
    """Per package and policy: tasks, the mean score, and the ids that scored wrong."""
    out: dict[str, Any] = {}
    for task in tasks:
        pkg = out.setdefault(task.package, {"tasks": 0})
        pkg["tasks"] += 1
        for name, files in POLICIES.items():
            passed = passes(task, files(task))
            row = pkg.setdefault(name, {"score": 0.0, "passed": 0, "wrong": []})
            row["passed"] += passed
            if passed != (name == "reference"):
                row["wrong"].append(task.instance_id)
    for pkg in out.values():
        for name in POLICIES:
            pkg[name]["score"] = pkg[name]["passed"] / pkg["tasks"]
    return dict(sorted(out.items()))


def first_per_package(tasks: list[Task], n: int | None) -> list[Task]:
    seen: dict[str, int] = {}
    chosen = []
    for task in tasks:
        pkg = task.package
        seen[pkg] = seen.get(pkg, 0) + 1
        if n is None or seen[pkg] <= n:
            chosen.append(task)
    return chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="runs/tasks/tasks.jsonl")
    p.add_argument("--per-package", type=int, default=None)
    p.add_argument("--out", default="bench/results/mined-scores.json")
    args = p.parse_args()
    from gagar.rollout.envs.verify import verify_files
    from gagar.sandbox.local import LocalFactory
    from gagar.sandbox.types import Limits

    factory = LocalFactory(limits=Limits(wall_time_s=600, cpu_time_s=600))
    tasks = first_per_package(load_tasks(args.tasks), args.per_package)
    started = time.monotonic()
    result = score(tasks, lambda task, files: verify_files(task, files, factory).passed)
    print(f"{'package':<16} {'tasks':>5} {'do-nothing':>10} {'reference':>9}")
    for name, pkg in result.items():
        row = f"{name:<16} {pkg['tasks']:>5} {pkg['do_nothing']['score']:>10.2f}"
        print(f"{row} {pkg['reference']['score']:>9.2f}")
    doc = {"tasks": args.tasks, "per_package": result}
    doc["seconds"] = round(time.monotonic() - started, 1)
    save(args.out, doc, indent=2)


if __name__ == "__main__":
    main()
