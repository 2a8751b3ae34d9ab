"""Every command the README shows exists: make targets in the Makefile, gagar subcommands in the CLI.

(`make run` and `make test` themselves are run by CI through .ci/run; the gagar commands have their
own behavioural tests.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gagar.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _commands(prefix: str) -> set[str]:
    """Commands in code spans (`gagar x ...`) and at the start of lines in fenced blocks."""
    spans = re.findall(rf"`{prefix} ([a-z][a-z0-9-]*)", README)
    blocks = "\n".join(re.findall(r"```\n(.*?)```", README, re.DOTALL))
    return set(spans) | set(re.findall(rf"^{prefix} ([a-z][a-z0-9-]*)", blocks, re.MULTILINE))


def test_make_targets_exist() -> None:
    targets = _commands("make")
    assert {"run", "test"} <= targets
    for target in targets:
        done = subprocess.run(
            ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"make {target}: {done.stderr}"


def test_gagar_subcommands_exist() -> None:
    parser = build_parser()
    choices = next(a for a in parser._actions if a.dest == "command").choices
    for command in _commands("gagar"):
        assert command in choices, f"README shows `gagar {command}` but the CLI has no such command"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_front_door_of_at_most_200_lines() -> None:
    """The README takes a newcomer in and links to docs/ for the detail (issue 49)."""
    lines = README.count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the detail to docs/"
    for link in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
