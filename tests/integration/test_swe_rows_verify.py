"""A SWE-bench row loaded from a repository cache verifies in the sandbox: the unfixed snapshot
fails exactly ``FAIL_TO_PASS`` (``PASS_TO_PASS`` passes), the row's reference ``patch`` passes
every listed test."""

from __future__ import annotations

from pathlib import Path

from gagar.rollout.envs.task import load_tasks
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox import Limits
from gagar.sandbox.local import LocalFactory
from tests.unit.test_envs_swe_rows import make_cache, swe_row, write_rows


def test_a_swe_bench_row_from_the_cache_fails_unfixed_and_passes_with_its_patch(
    tmp_path: Path,
) -> None:
    cache_dir, commit = make_cache(tmp_path)
    [task] = load_tasks(write_rows(tmp_path / "t.jsonl", [swe_row(commit)]), cache_dir)
    factory = LocalFactory(limits=Limits(wall_time_s=60))
    before = verify_files(task, task.repo_files(), factory)
    after = verify_files(task, task.fixed_files(), factory)
    assert before.valid and after.valid
    assert before.tests == {"test_calc.py::test_add": False, "test_calc.py::test_neg": True}
    assert after.passed and after.tests == {
        "test_calc.py::test_add": True,
        "test_calc.py::test_neg": True,
    }
