"""``gagar tasks mine``: code-repair tasks from pinned sdists (``miner.py``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gagar" / "sdists"


def _mine(args: argparse.Namespace) -> int:
    if args.sha256 and len(args.sha256) != len(args.packages):
        print("--sha256: give one per package, in the same order", file=sys.stderr)
        return 2
    pins = [(s, args.sha256[i] if args.sha256 else None, None) for i, s in enumerate(args.packages)]
    return _mine_all(pins, args, MineLimits(args.seed, args.max_edits, args.max_tasks))


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
    limits = MineLimits(
        recipe.seed, args.max_edits or recipe.max_edits, args.max_tasks or recipe.max_tasks
    )
    return _mine_all(pins, args, limits)


@dataclass(frozen=True)
class MineLimits:
    seed: int
    max_edits: int
    max_tasks: int | None


Pin = tuple[str, str | None, str | None]  # source, sha256, test command


def _mine_all(pins: Sequence[Pin], args: argparse.Namespace, limits: MineLimits) -> int:
    """Mine each (source, sha256, test command) into ``args.out``: one tasks.jsonl, one summary.

    ``args.jobs`` packages are mined at once, each in a process of its own; the rows are
    written in the order of ``pins`` whichever finishes first, so they are the same with any
    number of jobs."""
    from gagar.rollout.envs.mine.miner import dump_rows

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks, summaries = [], []
    for code, found, summary in _results(pins, args, limits):
        if code:
            return code
        tasks += found
        summaries.append(summary)
        print(_line(summary), flush=True)
        # after each package: a long build that stops keeps what it made
        dump_rows(tasks, out / "tasks.jsonl")
        (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    print(f"{len(tasks)} tasks -> {out / 'tasks.jsonl'}")
    return 0


def _results(
    pins: Sequence[Pin], args: argparse.Namespace, limits: MineLimits
) -> Iterator[tuple[int, list, dict]]:
    """``_mine_one`` of each pin, in the pins' order (in this process with one job)."""
    if args.jobs <= 1:
        yield from (_mine_one(pin, args, limits) for pin in pins)
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        done = [pool.submit(_mine_one, pin, args, limits) for pin in pins]
        try:
            yield from (future.result() for future in done)
        finally:  # a package that failed stops the build: no new package starts
            for future in done:
                future.cancel()


def _mine_one(pin: Pin, args: argparse.Namespace, limits: MineLimits) -> tuple[int, list, dict]:
    """One package in a worker process: (exit code, its tasks, its summary)."""
    from gagar.rollout.envs.mine import sdist
    from gagar.rollout.envs.mine.miner import MineConfig, MineError, mine
    from gagar.sandbox import Limits, SandboxUnavailable
    from gagar.sandbox.local import LocalFactory

    source, sha256, command = pin
    config = MineConfig(
        seed=limits.seed,
        max_edits=limits.max_edits,
        max_tasks=limits.max_tasks,
        verify=not args.no_verify,
    )
    if command:
        config = replace(config, test_command=command)
    try:
        factory = LocalFactory(
            limits=Limits(wall_time_s=config.timeout_s, cpu_time_s=int(config.timeout_s))
        )
    except SandboxUnavailable as err:
        print(f"cannot mine here: {err}", file=sys.stderr)
        return 2, [], {}
    try:
        pkg = sdist.load(source, Path(args.cache), sha256)
        found, summary = mine(pkg, factory, config, Path(args.out))
    except (sdist.SdistError, MineError) as err:
        print(f"{source}: {err}", file=sys.stderr)
        return 1, [], {}
    return 0, found, summary.to_json()


def _line(s: dict) -> str:
    rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items())
    return (
        f"{s['package']} {s['version']}: {s['tests']} stable tests ({len(s['flaky'])} flaky), "
        f"suite {s['suite_s']} s; tried {s['tried']} of {s['candidates']} edits, kept "
        f"{s['kept']}; rejected: {rejected}; {s['seconds']} s "
        f"({', '.join(f'{k} {v}' for k, v in s['phases'].items())})"
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
    p.add_argument("--max-tasks", type=int, default=None, help="tasks kept per package at most")
    _jobs(p)
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
    b.add_argument(
        "--max-tasks",
        type=int,
        default=None,
        help="tasks kept per package at most (default: the recipe's)",
    )
    _jobs(b)
    b.add_argument("--only", nargs="*", default=[], metavar="NAME", help="mine these packages only")
    b.add_argument("--cache", default=str(DEFAULT_CACHE), help="sdist cache (pip download)")
    b.add_argument(
        "--no-verify", action="store_true", help="skip checking each task with the verifier"
    )
    b.set_defaults(func=_build)


def _jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="packages mined at once, a process each (the rows are the same for any number)",
    )
