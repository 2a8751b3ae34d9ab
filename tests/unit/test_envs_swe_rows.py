"""SWE-bench rows as SWE-bench ships them load from a repository cache, or say in one line why not.

The cache is a git repository made here: one commit with a bug in ``calc.py``, its fix as the
row's ``patch``, and a ``test_patch`` adding the test that decides the task (as SWE-bench rows
carry them). Verification through the sandbox is in tests/integration/test_swe_rows_verify.py.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from gagar.cli import main
from gagar.driver.components import SetupError, load_sources
from gagar.rollout.envs.task import Task, TaskError, load_tasks, scan_tasks
from gagar.spec import DatasetSpec

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
FIXED = BUGGY.replace("return a - b", "return a + b")
OLD_TEST = "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"
NEW_TEST = OLD_TEST.replace("import neg", "import add, neg") + (
    "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)
PATCH = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
    " def add(a, b):\n-    return a - b\n+    return a + b\n"
)
TEST_PATCH = (
    "diff --git a/test_calc.py b/test_calc.py\n--- a/test_calc.py\n+++ b/test_calc.py\n"
    "@@ -1,5 +1,9 @@\n-from calc import neg\n+from calc import add, neg\n \n \n"
    " def test_neg():\n     assert neg(2) == -2\n+\n+\n+def test_add():\n+    assert add(2, 3) == 5\n"
)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env |= {"GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def make_cache(root: Path) -> tuple[Path, str]:
    """A repository cache holding ``acme/calc`` (a git checkout) and its buggy commit."""
    repo = root / "cache" / "acme__calc"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "test_calc.py").write_text(OLD_TEST)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "buggy")
    commit = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("# a later commit: never what the row reads\n")
    _git(repo, "commit", "-qam", "later")
    return root / "cache", commit


def swe_row(commit: str, **changes: object) -> dict:
    """A row with exactly SWE-bench's keys (test lists as JSON strings)."""
    row = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": commit,
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "problem_statement": "add(2, 3) returns -1",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(["test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["test_calc.py::test_neg"]),
        "environment_setup_commit": commit,
        "image_name": "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest",
    }
    return {**row, **changes}


def write_rows(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, str]:
    return make_cache(tmp_path)


def test_a_swe_bench_row_loads_from_a_git_checkout_at_its_base_commit(
    tmp_path: Path, cache: tuple[Path, str]
) -> None:
    cache_dir, commit = cache
    [task] = load_tasks(write_rows(tmp_path / "t.jsonl", [swe_row(commit)]), cache_dir)
    assert task.repo_files() == {"calc.py": BUGGY.encode(), "test_calc.py": OLD_TEST.encode()}
    assert task.test_files == {"test_calc.py": NEW_TEST}
    assert task.fail_to_pass == ["test_calc.py::test_add"]
    assert task.metadata["environment_setup_commit"] == commit
    # the reference ``patch`` applied, every file it does not touch kept
    assert task.fixed_files() == {"calc.py": FIXED.encode(), "test_calc.py": OLD_TEST.encode()}


def test_a_tarball_per_commit_is_read_before_the_clone(
    tmp_path: Path, cache: tuple[Path, str]
) -> None:
    cache_dir, commit = cache
    src = tmp_path / "tree"
    src.mkdir()
    (src / "calc.py").write_text(BUGGY)
    (src / "test_calc.py").write_text(OLD_TEST)
    with tarfile.open(cache_dir / "acme__calc" / f"{commit}.tar.gz", "w:gz") as tar:
        for name in ("calc.py", "test_calc.py"):
            tar.add(src / name, arcname=name)
    [task] = load_tasks(write_rows(tmp_path / "t.jsonl", [swe_row(commit)]), cache_dir)
    assert task.snapshot is not None and task.snapshot.endswith(".tar.gz")
    assert task.repo_files()["calc.py"] == BUGGY.encode()


@pytest.mark.parametrize(
    ("changes", "cache_given", "words"),
    [
        ({}, False, "(acme__calc-1): base_commit: acme/calc@"),
        ({"repo": "acme/other"}, True, "base_commit: repository 'acme/other' is not in the cache"),
        ({"base_commit": "f" * 40}, True, f"base_commit: commit {'f' * 40} of 'acme/calc'"),
        ({"FAIL_TO_PASS": "[oops"}, True, "FAIL_TO_PASS: Value error, not a JSON list"),
        ({"patch": PATCH.replace("a - b", "a * b")}, True, None),  # caught when verified
        ({"test_patch": TEST_PATCH.replace("neg(2)", "neg(3)")}, True, "test_patch:"),
        ({"repo": None}, True, "repo: a row with base_commit and no files needs 'repo'"),
    ],
)
def test_a_bad_row_is_one_line_naming_the_row_and_field(
    tmp_path: Path,
    cache: tuple[Path, str],
    changes: dict,
    cache_given: bool,
    words: str | None,
) -> None:
    cache_dir, commit = cache
    path = write_rows(tmp_path / "t.jsonl", [swe_row(commit, **changes)])
    tasks, problems = scan_tasks(path, cache_dir if cache_given else None)
    if words is None:
        assert problems == [] and len(tasks) == 1
        with pytest.raises(TaskError, match="acme__calc-1: patch:"):
            tasks[0].fixed_files()
        return
    [line] = problems
    assert line.startswith(f"{path}:1 (acme__calc-1): ") and "\n" not in line
    assert words in line


def test_a_row_with_neither_files_nor_a_commit_is_a_validation_error_not_a_crash(
    tmp_path: Path,
) -> None:
    row = {"instance_id": "x", "problem_statement": "p", "FAIL_TO_PASS": ["t.py::a"]}
    path = write_rows(tmp_path / "t.jsonl", [row])
    with pytest.raises(TaskError, match=r"t.jsonl:1 \(x\): task: Value error, give exactly one"):
        load_tasks(path)


def test_the_sources_repo_cache_reaches_the_loader(tmp_path: Path, cache: tuple[Path, str]) -> None:
    cache_dir, commit = cache
    path = write_rows(tmp_path / "t.jsonl", [swe_row(commit)])
    spec = {"sources": [{"kind": "jsonl", "path": str(path)}], "heldOutFraction": 0}
    with pytest.raises(SetupError, match=r"^spec.dataset.sources\[0\]: .*needs a repository cache"):
        load_sources(DatasetSpec.model_validate(spec))
    spec["sources"][0]["repoCache"] = str(cache_dir)  # type: ignore[index]
    [[task]], _ = load_sources(DatasetSpec.model_validate(spec))
    assert isinstance(task, Task) and task.repo_files()["calc.py"] == BUGGY.encode()


RUN = """apiVersion: gagar.dev/v1alpha1
kind: GagarRun
metadata: {name: swe}
spec:
  model: {preset: tiny}
  dataset:
    sources:
      - kind: jsonl
        path: %s
"""


def _manifest(tmp_path: Path, rows: Path, cache_dir: Path | None) -> Path:
    doc = yaml.safe_load(RUN % rows)
    if cache_dir is not None:
        doc["spec"]["dataset"]["sources"][0]["repoCache"] = str(cache_dir)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_reads_the_dataset_and_names_each_bad_row(
    tmp_path: Path, cache: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cache_dir, commit = cache
    rows = [swe_row(commit), swe_row(commit, instance_id="acme__calc-2", repo="acme/gone"), "{"]
    path = write_rows(tmp_path / "t.jsonl", rows)
    manifest = _manifest(tmp_path, path, cache_dir)
    assert main(["validate", str(manifest)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{manifest}[0]: spec.dataset.sources[0]: {path}:2 (acme__calc-2): base_commit: "
        f"repository 'acme/gone' is not in the cache ({cache_dir}/acme__gone does not exist)",
        f"{manifest}[0]: spec.dataset.sources[0]: {path}:3: not JSON: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)",
    ]


def test_validate_without_a_cache_names_the_row(
    tmp_path: Path, cache: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, commit = cache
    manifest = _manifest(tmp_path, write_rows(tmp_path / "t.jsonl", [swe_row(commit)]), None)
    assert main(["validate", str(manifest)]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "sources[0]: " in line and "(acme__calc-1): base_commit: " in line
    assert "needs a repository cache" in line


def test_validate_passes_a_good_dataset_and_notes_one_not_on_this_machine(
    tmp_path: Path, cache: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cache_dir, commit = cache
    manifest = _manifest(tmp_path, write_rows(tmp_path / "t.jsonl", [swe_row(commit)]), cache_dir)
    assert main(["validate", str(manifest)]) == 0
    assert "is valid" in capsys.readouterr().out
    elsewhere = _manifest(tmp_path, tmp_path / "absent.jsonl", None)
    assert main(["validate", str(elsewhere)]) == 0
    assert "not on this machine" in capsys.readouterr().out


def test_a_repo_cache_on_a_source_other_than_jsonl_is_refused() -> None:
    with pytest.raises(ValueError, match="repoCache is for jsonl sources only"):
        DatasetSpec.model_validate({"sources": [{"kind": "synthetic", "repoCache": "/r"}]})
