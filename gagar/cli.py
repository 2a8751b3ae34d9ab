"""The ``gagar`` command. Each component contributes subcommands through a ``register`` function.

Validation happens here, at the boundary: files are parsed into ``gagar.spec`` models once, and
errors are printed with their file, document index and field path.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that add subcommands: each defines ``register(subparsers)``; each subcommand sets
# ``func(args) -> int`` with ``set_defaults``. Imports are lazy inside the handlers so that
# ``gagar validate`` does not pay for torch or kopf.
COMMAND_MODULES = [
    "gagar.commands",
    "gagar.sandbox.cli",
    "gagar.driver.cli",
    "gagar.trainer.model.cli",
    "gagar.rollout.cli",
    "gagar.grader.cli",
    "gagar.operator.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gagar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
