"""``gagar tasks mine``: code-repair tasks from pinned sdists (``miner.py``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gagar" / "sdists"


def _mine(args: argparse.Namespace) -> int:
    if args.sha256 and len(args.sha256) != len(args.packages):
        print("--sha256: give one per package, in the same order", file=sys.stderr)
        return 2
    pins = [(s, args.sha256[i] if args.sha256 else None, None) for i, s in enumerate(args.packages)]
    return _mine_all(pins, args, args.seed, args.max_edits)


def _build(args: argparse.Namespace) -> int:
    from gagar.rollout.envs.mine.recipe import RECIPE, RecipeError, load_recipe
    from gagar.rollout.envs.mine.sdist import normalize

    try:
        recipe = load_recipe(Path(args.recipe) if args.recipe else RECIPE)
    except RecipeError as err:
        print(err, file=sys.stderr)
        return 2
    only = {normalize(n) for n in args.only}
    chosen = [p for p in recipe.packages if not only or p.name in only]
    unknown = sorted(only - {p.name for p in recipe.packages})
    if unknown:
        print(f"--only: not in the recipe: {', '.join(unknown)}", file=sys.stderr)
        return 2
    pins = [(p.pin, p.sha256, p.test_command) for p in chosen]
    return _mine_all(pins, args, recipe.seed, args.max_edits or recipe.max_edits)


def _mine_all(
    pins: Sequence[tuple[str, str | None, str | None]],
    args: argparse.Namespace,
    seed: int,
    edits: int,
) -> int:
    """Mine each (source, sha256, test command) into ``args.out``: one tasks.jsonl, one summary."""
    from gagar.rollout.envs.mine import sdist
    from gagar.rollout.envs.mine.miner import MineConfig, MineError, dump_rows, mine
    from gagar.sandbox import Limits, SandboxUnavailable
    from gagar.sandbox.local import LocalFactory

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = MineConfig(seed=seed, max_edits=edits, verify=not args.no_verify)
    limits = Limits(wall_time_s=config.timeout_s, cpu_time_s=int(config.timeout_s))
    try:
        factory = LocalFactory(limits=limits)
    except SandboxUnavailable as err:
        print(f"cannot mine here: {err}", file=sys.stderr)
        return 2
    tasks, summaries = [], []
    for source, sha256, command in pins:
        cfg = replace(config, test_command=command) if command else config
        try:
            pkg = sdist.load(source, Path(args.cache), sha256)
            found, summary = mine(pkg, factory, cfg, out)
        except (sdist.SdistError, MineError) as err:
            print(f"{source}: {err}", file=sys.stderr)
            return 1
        tasks += found
        summaries.append(summary.to_json())
        print(_line(summary.to_json()), flush=True)
        # after each package: a long build that stops keeps what it made
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
    b = tsub.add_parser(
        "build",
        help="mine every package of a recipe (pins, sha256s, a seed) into one dataset folder",
    )
    b.add_argument(
        "recipe",
        nargs="?",
        default=None,
        help="recipe TOML (default: the repository's, recipe.toml)",
    )
    b.add_argument(
        "--out", required=True, help="directory for tasks.jsonl, snapshots/, summary.json"
    )
    b.add_argument(
        "--max-edits",
        type=int,
        default=None,
        help="edits tried per package (default: the recipe's)",
    )
    b.add_argument("--only", nargs="*", default=[], metavar="NAME", help="mine these packages only")
    b.add_argument("--cache", default=str(DEFAULT_CACHE), help="sdist cache (pip download)")
    b.add_argument(
        "--no-verify", action="store_true", help="skip checking each task with the verifier"
    )
    b.set_defaults(func=_build)
