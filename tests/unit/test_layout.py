"""Every module under ``gagar/`` serves the product: test fixtures live under ``tests/``.

A module counts as used when another module of the package imports it (or names it in a string,
as ``python -m gagar.driver.worker`` in the trainer's manifest does), or when ``pyproject.toml``
registers it (the ``gagar`` script, vLLM's plugins). A module only ``tests/`` or ``bench/`` import
is a fixture in the package: move it to ``tests/support/``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_NAME = re.compile(r"\bgagar(?:\.\w+)+")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named_modules(source: str) -> set[str]:
    """Modules a file imports (``from a.b import c`` names ``a.b`` and ``a.b.c``) or spells out."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(MODULE_NAME.findall(node.value))
    return found


def unused_modules(root: Path) -> dict[str, bool]:
    """Modules of the package no other package module uses, each with whether tests/bench do."""
    package = sorted((root / "gagar").rglob("*.py"))
    used: set[str] = set()
    for path in package:
        used |= named_modules(path.read_text()) - {module_name(path, root)}
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    used |= set(MODULE_NAME.findall(str(pyproject.get("scripts", {}))))
    used |= set(MODULE_NAME.findall(str(pyproject.get("entry-points", {}))))
    outside: set[str] = set()
    for folder in ("tests", "bench"):
        for path in (root / folder).rglob("*.py"):
            outside |= named_modules(path.read_text())
    return {
        name: name in outside
        for path in package
        if path.name != "__init__.py"
        and not any(
            u == (name := module_name(path, root)) or u.startswith(name + ".") for u in used
        )
    }


def test_no_module_of_the_package_serves_only_tests_or_benchmarks() -> None:
    unused = unused_modules(ROOT)
    fixtures = sorted(name for name, by_tests in unused.items() if by_tests)
    assert fixtures == [], (
        f"move these to tests/support/ (only tests/bench import them): {fixtures}"
    )
    assert sorted(unused) == [], f"modules nothing imports: {sorted(unused)}"


def test_the_check_sees_a_fixture_in_the_package(tmp_path: Path) -> None:
    (tmp_path / "gagar" / "rollout").mkdir(parents=True)
    (tmp_path / "gagar" / "__init__.py").write_text("")
    (tmp_path / "gagar" / "cli.py").write_text("from gagar.rollout import agent\n")
    (tmp_path / "gagar" / "rollout" / "agent.py").write_text("X = 1\n")
    (tmp_path / "gagar" / "rollout" / "tiny.py").write_text("Y = 2\n")
    (tmp_path / "gagar" / "rollout" / "plugin.py").write_text("Z = 3\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("from gagar.rollout.tiny import Y\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nscripts = {gagar = "gagar.cli:main"}\n'
        '[project.entry-points."vllm.general_plugins"]\np = "gagar.rollout.plugin:register"\n'
    )
    assert unused_modules(tmp_path) == {"gagar.rollout.tiny": True}
