"""Spec-level subcommands: ``gagar validate``, ``gagar crd``, ``gagar version``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gagar import __version__
from gagar.operator.cli import trust_flags

if TYPE_CHECKING:
    from gagar.spec import GagarRun

REPO_ROOT = Path(__file__).resolve().parent.parent


def _version(args: argparse.Namespace) -> int:
    print(__version__)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from gagar.manifest import Problem, load_files
    from gagar.operator.builders.check import pod_problems
    from gagar.operator.builders.trust import trust_problems
    from gagar.operator.cli import trust_policy

    loaded = load_files(args.files)
    problems, valid, notes = list(loaded.problems), [], list(loaded.skipped)
    policy = trust_policy(args)  # the chart's defaults unless the flags say otherwise
    for source, index, run in loaded.runs:  # the pods it renders, as the API server checks them
        found = [Problem(source, index, path, msg) for path, msg in pod_problems(run)]
        found += [Problem(source, index, p, m) for p, m in trust_problems(run, policy)]
        found += [Problem(source, index, p, m) for p, m in _checkpoint_problems(run)]
        for path, msg, checked in [*_dataset_problems(run), *_environment_problems(run)]:
            (found if checked else notes).append(Problem(source, index, path, msg))
        problems += found
        valid += [] if found else [f"{source}[{index}]: GagarRun {run.metadata.name!r} is valid"]
    for problem in problems:
        print(problem, file=sys.stderr)
    for line in [*notes, *valid]:
        print(line)
    return 1 if problems else 0


def _checkpoint_problems(run: GagarRun) -> list[tuple[str, str]]:
    """A MoE checkpoint on this machine whose run omits ``model.numExperts``: the layout rules
    that need it (tensor parallelism refused, expert parallelism dividing it) cannot hold, and
    the trainer would fail at start (issue 49). A checkpoint elsewhere is the trainer's check."""
    import json

    path = run.spec.model.path
    config = Path(path) / "config.json" if path and "://" not in path else None
    if config is None or run.spec.model.num_experts is not None or not config.is_file():
        return []
    try:
        cfg = json.loads(config.read_text())
    except (OSError, ValueError):
        return []
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") if isinstance(cfg, dict) else 0
    if not experts:
        return []
    return [("spec.model.numExperts", f"the checkpoint's config.json has {experts} routed "
             f"experts (a MoE model): set numExperts: {experts}, which the parallel layout is "
             "checked against")]  # fmt: skip


MAX_ROW_PROBLEMS = 20  # per source: a dataset with a systematic fault would print every row


def _dataset_problems(run: GagarRun) -> list[tuple[str, str, bool]]:
    """(field, message, is a problem) for the run's JSONL sources read on this machine, one per
    bad row (file, line, instance id, field and why), as ``gagar train`` would load them. A file
    not on this machine (a cluster run's volume) is a note, not a problem."""
    from gagar.rollout.envs.task import scan_tasks

    out = []
    for i, src in enumerate(run.spec.dataset.sources):
        if src.kind not in ("jsonl", "mined") or src.path is None:
            continue
        field = f"spec.dataset.sources[{i}]"
        if not Path(src.path).is_file():
            out.append((f"{field}.path", "not on this machine: its rows are not checked", False))
            continue
        envs = [e.name for e in run.spec.sandbox.environments]
        _, bad = scan_tasks(src.path, src.repo_cache, envs)
        more = [f"... and {len(bad) - MAX_ROW_PROBLEMS} more bad rows"]
        shown = bad[:MAX_ROW_PROBLEMS] + (more if len(bad) > MAX_ROW_PROBLEMS else [])
        out += [(field, line, True) for line in shown]
    return out


def _environment_problems(run: GagarRun) -> list[tuple[str, str, bool]]:
    """(field, message, is a problem) for the run's environment locks read on this machine: a
    requirement without a hash is one (``pip --require-hashes`` would refuse the lock when
    ``gagar train`` starts); a lock not on this machine is a note."""
    from gagar.sandbox.venvs import unhashed

    out = []
    for i, env in enumerate(run.spec.sandbox.environments):
        if env.lock is None:  # backend pods: an image, built elsewhere
            continue
        field = f"spec.sandbox.environments[{i}].lock"
        try:
            text = Path(env.lock).read_text()
        except (OSError, UnicodeDecodeError):
            out.append((field, "not on this machine: its lock is not checked", False))
            continue
        out += [(field, f"{env.lock}: {why}", True) for why in unhashed(text)[:MAX_ROW_PROBLEMS]]
    return out


def _crd(args: argparse.Namespace) -> int:
    from gagar.generated import crd_yaml, drifted, write_all

    root = Path(args.root)
    if args.write:
        for rel in write_all(root):
            print(f"wrote {rel}")
        return 0
    if args.check:
        stale = drifted(root)
        for rel in stale:
            print(f"{rel} is out of date: run `make crd`", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(crd_yaml())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print gagar's version")
    p.set_defaults(func=_version)

    p = sub.add_parser(
        "validate",
        help="validate GagarRun manifests (YAML, several documents per file; other objects, "
        "a Namespace say, are skipped with a note)",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    trust_flags(p, label=False)  # a Secret's label is the cluster's: the operator checks it
    p.set_defaults(func=_validate)

    p = sub.add_parser("crd", help="print the GagarRun CRD generated from the spec models")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--write",
        action="store_true",
        help="rewrite the checked-in generated files (the CRDs, the chart's values schema and "
        "README, the field reference docs/reference.md)",
    )
    mode.add_argument(
        "--check", action="store_true", help="fail when a checked-in generated file drifted"
    )
    p.add_argument("--root", default=str(REPO_ROOT), help=argparse.SUPPRESS)
    p.set_defaults(func=_crd)
