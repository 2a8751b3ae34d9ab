"""The ``gagar`` command in an image that installs one component's extra only.

The operator image has no torch and the sandbox image no kopf: ``gagar``'s parser must still
build there, keeping the installed components' commands and naming the missing ones, while a
broken import inside gagar itself still fails loudly.
"""

from __future__ import annotations

import sys

import pytest

from gagar import cli


@pytest.fixture
def command_module(tmp_path, monkeypatch):
    """Write a command module importing ``target`` and add it to the command modules."""

    def make(target: str) -> str:
        name = f"gagar_extra_probe_{abs(hash(target))}"
        (tmp_path / f"{name}.py").write_text(f"import {target}\n\ndef register(sub):\n    pass\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(cli, "COMMAND_MODULES", [*cli.COMMAND_MODULES, name])
        monkeypatch.delitem(sys.modules, name, raising=False)
        return name

    return make


def test_a_component_without_its_dependency_leaves_the_other_commands(command_module, capsys):
    name = command_module("a_dependency_that_is_not_installed")
    parser = cli.build_parser()
    assert f"{name} (needs a_dependency_that_is_not_installed)" in parser.epilog
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip()


def test_a_missing_gagar_module_is_an_error(command_module):
    command_module("gagar.no_such_module")
    with pytest.raises(ModuleNotFoundError, match=r"gagar\.no_such_module"):
        cli.build_parser()


def test_with_everything_installed_nothing_is_missing():
    assert cli.build_parser().epilog == cli.EPILOG  # no "Not installed here" line
