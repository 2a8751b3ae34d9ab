"""Spec-level subcommands: ``gagar version`` (more are added as the spec module lands)."""

from __future__ import annotations

import argparse

from gagar import __version__


def _version(args: argparse.Namespace) -> int:
    print(__version__)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print gagar's version")
    p.set_defaults(func=_version)
