"""A ``mined`` dataset source: the rows ``gagar tasks mine`` writes, held out by whole package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagar.driver.components import load_sources
from gagar.spec import DatasetSpec


def _rows(path: Path, packages: dict[str, int]) -> Path:
    rows = [
        {
            "instance_id": f"{pkg}-1.0.flip_comparison.{i}",
            "family": "mined",
            "problem_statement": "tests fail",
            "files": {"m.py": f"{pkg} = {i}\n"},
            "FAIL_TO_PASS": ["tests/test_m.py::test_a"],
            "metadata": {"package": pkg, "version": "1.0"},
        }
        for pkg, n in packages.items()
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_held_out_tasks_are_whole_packages(tmp_path: Path, seed: int) -> None:
    path = _rows(tmp_path / "mined.jsonl", {"parse": 5, "tinydb": 4, "toolz": 6})
    spec = {"sources": [{"kind": "mined", "path": str(path), "seed": seed}]}
    spec["heldOutFraction"] = 0.34  # type: ignore[assignment]
    [train], held = load_sources(DatasetSpec.model_validate(spec))
    held_pkgs = {t.metadata["package"] for t in held}
    train_pkgs = {t.metadata["package"] for t in train}
    assert len(held_pkgs) == 1 and not held_pkgs & train_pkgs
    assert len(train) + len(held) == 15


def test_a_mined_source_needs_a_path() -> None:
    with pytest.raises(ValueError, match="path is required for jsonl and mined sources"):
        DatasetSpec.model_validate({"sources": [{"kind": "mined"}]})
