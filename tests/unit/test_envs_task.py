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
    # the row's image is kept in metadata too (Task.image: tests/unit/test_task_images_trainer.py)
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
        ({k: v for k, v in SWE_ROW.items() if k != "snapshot"}, "needs a repository cache"),
        (
            {k: v for k, v in SWE_ROW.items() if k not in ("snapshot", "base_commit")},
            "exactly one of 'files'",
        ),
        ({**SWE_ROW, "snapshot": None, "files": {"../evil.py": ""}}, "must be relative"),
        (
            {
                **SWE_ROW,
                "snapshot": None,
                "files": {"t.py": "a\n"},
                "test_patch": "--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-b\n+c\n",
            },
            "test_patch: t.py: hunk @@ -1 .1 @@ does not apply",
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


TEST_PATCH = """diff --git a/tests/test_a.py b/tests/test_a.py
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1,2 +1,3 @@
 def test_old():
     assert True
+def test_new(): assert 1
diff --git a/tests/test_b.py b/tests/test_b.py
new file mode 100644
--- /dev/null
+++ b/tests/test_b.py
@@ -0,0 +1 @@
+def test_b(): pass
\\ No newline at end of file
"""


def test_test_patch_is_applied_into_the_test_files(tmp_path: Path) -> None:
    """SWE-bench's ``test_patch``: the files it changes or creates are what verification writes."""
    files = {"pkg/a.py": "x = 1\n", "tests/test_a.py": "def test_old():\n    assert True\n"}
    row = {**SWE_ROW, "snapshot": None, "files": files, "test_patch": TEST_PATCH}
    [task] = load_tasks(_write(tmp_path, [row]))
    assert task.test_files == {
        "tests/test_a.py": "def test_old():\n    assert True\ndef test_new(): assert 1\n",
        "tests/test_b.py": "def test_b(): pass",
    }
    assert task.repo_files()["tests/test_a.py"] == files["tests/test_a.py"].encode()  # base kept
    again = Task.model_validate(task.model_dump())  # re-validated (e.g. off the wire): the same
    assert again.test_files == task.test_files
    (tmp_path / "repo" / "tests").mkdir(parents=True)
    (tmp_path / "repo" / "tests" / "test_a.py").write_text(files["tests/test_a.py"])
    [from_dir] = load_tasks(_write(tmp_path, [{**SWE_ROW, "test_patch": TEST_PATCH}]))
    assert from_dir.test_files == task.test_files


@pytest.mark.parametrize("seed", range(6))
def test_patches_round_trip_through_the_grader_diff(seed: int) -> None:
    """``apply_patch`` inverts the unified diffs gagar writes (``grader.diffs.unified_patch``)."""
    from gagar.grader.diffs import unified_patch
    from gagar.rollout.envs.patches import apply_patch

    task = synthetic.generate(seed)
    base = {k: v.decode() for k, v in task.repo_files().items()}
    final = {k: v.decode() for k, v in task.fixed_files().items()}
    final["new_dir/extra.py"] = "no trailing newline"
    changed = {k: v for k, v in final.items() if base.get(k) != v}
    assert changed and apply_patch(base, unified_patch(base, final)) == changed


def test_a_blank_context_line_without_its_space_still_applies() -> None:
    from gagar.rollout.envs.patches import apply_patch

    patch = "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n"  # some tools drop it
    assert apply_patch({"x.py": "a\n\nb\n"}, patch) == {"x.py": "a\n\nc\n"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a\n", "is cut short"),
        ("--- a/x.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "deleting files is not supported"),
        ("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renaming files is not supported"),
        ("--- a/z.py\n+++ b/z.py\n@@ -1 +1 @@\n-a\n+b\n", "a file the repository does not have"),
        ("just text", "no file changes found"),
    ],
)
def test_patches_that_cannot_apply_are_refused(patch: str, message: str) -> None:
    from gagar.rollout.envs.patches import PatchError, apply_patch

    with pytest.raises(PatchError, match=message):
        apply_patch({"x.py": "a\n"}, patch)


HELD_ROW = {
    "instance_id": "pkg-1.0.flip_comparison.0",
    "problem_statement": "tests fail",
    "files": {"m.py": "x = 1\n"},
    "FAIL_TO_PASS": ["t.py::a", "t.py::b"],
    "PASS_TO_PASS": ["t.py::c", "t.py::d", "t.py::e"],
    "HELD_BACK": ["t.py::b", "t.py::d"],
}


def test_held_back_tests_are_listed_for_evaluation_and_unlisted_for_training(
    tmp_path: Path,
) -> None:
    [task] = load_tasks(_write(tmp_path, [HELD_ROW]))
    assert task.test_ids == ["t.py::a", "t.py::b", "t.py::c", "t.py::d", "t.py::e"]
    seen = task.visible()
    assert (seen.fail_to_pass, seen.pass_to_pass) == (["t.py::a"], ["t.py::c", "t.py::e"])
    assert seen.held_back == [] and seen.visible() is seen
    assert task.content_key() != seen.content_key()


@pytest.mark.parametrize(
    ("held", "message"),
    [
        (["t.py::z"], "held_back: not in FAIL_TO_PASS or PASS_TO_PASS"),
        (["t.py::a", "t.py::b"], "one must stay visible"),
    ],
)
def test_held_back_tests_must_be_listed_and_leave_a_failing_one(
    tmp_path: Path, held: list[str], message: str
) -> None:
    with pytest.raises(TaskError, match=message):
        load_tasks(_write(tmp_path, [{**HELD_ROW, "HELD_BACK": held}]))
