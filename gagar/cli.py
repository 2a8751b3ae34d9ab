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
    "gagar.rollout.envs.mine.cli",
    "gagar.grader.cli",
    "gagar.operator.cli",
]
# Subcommands one component adds under another's command: ``gagar grader eval`` builds its groups
# with the driver's scripted experts, which the grader package may not import.
NESTED = {"grader": ["gagar.driver.grader_eval", "gagar.driver.grader_sft_job"]}


def _nested(sub: argparse._SubParsersAction) -> None:
    for parent, names in NESTED.items():
        if parent not in sub.choices:
            continue  # the parent's component is not installed here
        (children,) = [
            a for a in sub.choices[parent]._actions if isinstance(a, argparse._SubParsersAction)
        ]
        for name in names:
            try:
                importlib.import_module(name).register(children)
            except ModuleNotFoundError as err:
                if (err.name or "gagar").split(".")[0] == "gagar":
                    raise


# What `gagar --help` says: for the people who run gagar (the module docstring is for its
# developers).
DESCRIPTION = (
    "RL for code agents with GAGAR (groupwise agentic grading and advantage redistribution). "
    "Train a GagarRun on this machine (gagar train RUN.yaml), check one and see what it makes "
    "on Kubernetes (gagar validate, gagar render), and run the operator and the services its "
    "pods run."
)
EPILOG = "`gagar COMMAND --help` gives every flag of a command."
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gagar", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    missing = []
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # An image installs one component's extra only (the operator image has no torch):
            # its commands stay, the others are listed as not installed. gagar's own modules
            # must import.
            if (err.name or "gagar").split(".")[0] == "gagar":
                raise
            missing.append(f"{name} (needs {err.name})")
            continue
        module.register(sub)
    _nested(sub)
    if missing:
        parser.epilog = f"{EPILOG} Not installed here: " + ", ".join(missing) + "."
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; Ctrl-C ends it with one line and status 130, not a traceback (a command
    that can stop cleanly, ``gagar train`` writing its checkpoint, handles it first)."""
    command = "gagar"
    try:
        args = build_parser().parse_args(argv)
        command = f"gagar {args.command}"
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
