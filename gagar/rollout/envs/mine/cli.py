"""``gagar tasks mine``: code-repair tasks from pinned sdists (``miner.py``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gagar" / "sdists"


def _mine(args: argparse.Namespace) -> int:
    from gagar.rollout.envs.mine import sdist
    from gagar.rollout.envs.mine.miner import MineConfig, MineError, dump_rows, mine
    from gagar.sandbox import Limits, SandboxUnavailable
    from gagar.sandbox.local import LocalFactory

    if args.sha256 and len(args.sha256) != len(args.packages):
        print("--sha256: give one per package, in the same order", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = MineConfig(seed=args.seed, max_edits=args.max_edits, verify=not args.no_verify)
    limits = Limits(wall_time_s=config.timeout_s, cpu_time_s=int(config.timeout_s))
    try:
        factory = LocalFactory(limits=limits)
    except SandboxUnavailable as err:
        print(f"cannot mine here: {err}", file=sys.stderr)
        return 2
    tasks, summaries = [], []
    for i, source in enumerate(args.packages):
        pin = args.sha256[i] if args.sha256 else None
        try:
            pkg = sdist.load(source, Path(args.cache), pin)
            found, summary = mine(pkg, factory, config, out)
        except (sdist.SdistError, MineError) as err:
            print(f"{source}: {err}", file=sys.stderr)
            return 1
        tasks += found
        summaries.append(summary.to_json())
        print(_line(summary.to_json()), flush=True)
    dump_rows(tasks, out / "tasks.jsonl")
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    print(f"{len(tasks)} tasks -> {out / 'tasks.jsonl'}")
    return 0


def _line(s: dict) -> str:
    rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items())
    return (
        f"{s['package']} {s['version']}: {s['tests']} stable tests ({len(s['flaky'])} flaky), "
        f"suite {s['suite_s']} s; tried {s['tried']} of {s['candidates']} edits, kept "
        f"{s['kept']}; rejected: {rejected}; {s['seconds']} s"
    )


def register(sub: argparse._SubParsersAction) -> None:
    tasks = sub.add_parser("tasks", help="task datasets: mine code-repair tasks from real packages")
    tsub = tasks.add_subparsers(dest="tasks_command", required=True, metavar="SUBCOMMAND")
    p = tsub.add_parser(
        "mine",
        help="plant bugs that a package's own tests catch (pinned sdists, a seed: same rows)",
    )
    p.add_argument("packages", nargs="+", metavar="PACKAGE", help="name==version or an sdist file")
    p.add_argument(
        "--out", required=True, help="directory for tasks.jsonl, snapshots/, summary.json"
    )
    p.add_argument("--seed", type=int, default=0, help="orders the edits tried (default 0)")
    p.add_argument("--max-edits", type=int, default=100, help="edits tried per package")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), help="sdist cache (pip download)")
    p.add_argument("--sha256", nargs="*", default=[], help="expected sha256 per package")
    p.add_argument(
        "--no-verify", action="store_true", help="skip checking each task with the verifier"
    )
    p.set_defaults(func=_mine)
