"""Spec-level subcommands: ``gagar validate``, ``gagar crd``, ``gagar version``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gagar import __version__

REPO_ROOT = Path(__file__).resolve().parent.parent


def _version(args: argparse.Namespace) -> int:
    print(__version__)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from gagar.manifest import Problem, load_files
    from gagar.operator.builders.check import pod_problems

    loaded = load_files(args.files)
    problems, valid = list(loaded.problems), []
    for source, index, run in loaded.runs:  # the pods it renders, as the API server checks them
        found = [Problem(source, index, path, msg) for path, msg in pod_problems(run)]
        problems += found
        valid += [] if found else [f"{source}[{index}]: GagarRun {run.metadata.name!r} is valid"]
    for problem in problems:
        print(problem, file=sys.stderr)
    for line in valid:
        print(line)
    return 1 if problems else 0


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
        "validate", help="validate GagarRun manifests (YAML, several documents per file)"
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=_validate)

    p = sub.add_parser("crd", help="print the GagarRun CRD generated from the spec models")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the checked-in generated files")
    mode.add_argument(
        "--check", action="store_true", help="fail when a checked-in generated file drifted"
    )
    p.add_argument("--root", default=str(REPO_ROOT), help=argparse.SUPPRESS)
    p.set_defaults(func=_crd)
