"""Task format: SWE-style rows load, bad rows fail with line and field; synthetic generation."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from gagar.rollout.envs import catalog, synthetic
from gagar.rollout.envs.task import Task, TaskError, dump_tasks, load_tasks, parse_task
from gagar.rollout.envs.verify import suspected_tampering

SWE_ROW = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "problem_statement": "Modeling's separability_matrix does not compute separability correctly",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]',
    "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
    "version": "4.3",
    "image_name": "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest",
    "snapshot": "repo",
}


def _write(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_swe_row_loads_with_snapshot_dir(tmp_path: Path) -> None:
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "a.py").write_text("x = 1\n")
    [task] = load_tasks(_write(tmp_path, [SWE_ROW]))
    assert task.fail_to_pass == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"
    ]
    # the row's image is information only (every task runs in spec.sandbox.image)
    assert task.metadata == {
        "base_commit": SWE_ROW["base_commit"],
        "version": "4.3",
        "image_name": SWE_ROW["image_name"],
    }
    assert task.repo_files() == {"pkg/a.py": b"x = 1\n"}


def test_snapshot_tarball(tmp_path: Path) -> None:
    src = tmp_path / "a.py"
    src.write_text("y = 2\n")
    with tarfile.open(tmp_path / "repo.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="a.py")
    [task] = load_tasks(_write(tmp_path, [{**SWE_ROW, "snapshot": "repo.tar.gz"}]))
    assert task.repo_files() == {"a.py": b"y = 2\n"}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "tasks.jsonl:1: not JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({**SWE_ROW, "FAIL_TO_PASS": "[oops"}, "FAIL_TO_PASS"),
        ({**SWE_ROW, "FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS"),
        ({**SWE_ROW, "problem_statment": "typo"}, "problem_statment: Extra inputs"),
        ({k: v for k, v in SWE_ROW.items() if k != "snapshot"}, "exactly one of 'files'"),
        ({**SWE_ROW, "snapshot": None, "files": {"../evil.py": ""}}, "must be relative"),
        (
            {**SWE_ROW, "test_patch": "diff --git a/t.py b/t.py"},
            "test_patch: Value error, gagar does not apply a test diff",
        ),
    ],
)
def test_bad_rows_name_line_and_field(tmp_path: Path, row, message: str) -> None:
    with pytest.raises(TaskError, match=message.replace("[", r"\[")):
        load_tasks(_write(tmp_path, [row]))


def test_duplicate_missing_and_empty_files(tmp_path: Path) -> None:
    row = {**SWE_ROW, "snapshot": None, "files": {"a.py": ""}}
    with pytest.raises(TaskError, match="duplicate instance_id"):
        load_tasks(_write(tmp_path, [row, row]))
    with pytest.raises(TaskError, match="no such file"):
        load_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(TaskError, match="no tasks"):
        load_tasks(_write(tmp_path, [""]))
    with pytest.raises(TaskError, match="does not exist"):
        parse_task({**SWE_ROW, "snapshot": "/nonexistent"}).repo_files()


def test_round_trip(tmp_path: Path) -> None:
    tasks = synthetic.generate_many(3, seed=10)
    dump_tasks(tasks, tmp_path / "t.jsonl")
    assert load_tasks(tmp_path / "t.jsonl") == tasks


def test_generation_is_deterministic_and_varied() -> None:
    assert synthetic.generate(7) == synthetic.generate(7)
    tasks = synthetic.generate_many(60, seed=0)
    kinds = {t.metadata["mutation_kind"] for t in tasks}
    assert kinds == {
        "wrong_operator",
        "off_by_one",
        "wrong_comparison",
        "wrong_variable",
        "missing_case",
    }
    assert len({t.problem_statement for t in tasks}) > 30
    for t in tasks:
        assert t.fail_to_pass and set(t.fail_to_pass).isdisjoint(t.pass_to_pass)
        visible = "".join(t.files[p] for p in t.test_files)
        assert all(tid.rsplit("::", 1)[1] + "(" not in visible for tid in t.fail_to_pass)


def test_every_catalog_mutation_is_revealed() -> None:
    for t in catalog.TEMPLATES:
        assert all(synthetic._run_tests(t, t.source)), t.name
        for m in t.mutations:
            assert t.source.count(m.old) == 1, (t.name, m)
            assert not all(synthetic._run_tests(t, t.source.replace(m.old, m.new))), (t.name, m)


def test_tampering_detection() -> None:
    task = synthetic.generate(1)
    test_path = next(iter(task.test_files))
    patch = (
        f"diff --git a/{test_path} b/{test_path}\n"
        "diff --git a/conftest.py b/conftest.py\n"
        "diff --git a/sitecustomize.py b/sitecustomize.py\n"
        "diff --git a/pkg/x.pth b/pkg/x.pth\n"
        "diff --git a/pkg/mod.py b/pkg/mod.py\n"
    )
    assert suspected_tampering(patch, task) == sorted(
        [test_path, "conftest.py", "sitecustomize.py", "pkg/x.pth"]
    )


def test_task_requires_fail_to_pass() -> None:
    with pytest.raises(ValueError):
        Task(instance_id="x", problem_statement="p", files={}, fail_to_pass=[])
