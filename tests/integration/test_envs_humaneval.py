"""HumanEval as repository tasks: canonical solutions pass, stubs fail, through the sandbox."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gagar.rollout.envs import humaneval
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits

LIMITS = Limits(wall_time_s=120, cpu_time_s=60, memory_bytes=2 << 30)


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=LIMITS)


def test_all_164_problems_load() -> None:
    tasks = humaneval.tasks()
    assert len(tasks) == 164 and len({t.instance_id for t in tasks}) == 164
    t = tasks[0]
    assert t.files["solution.py"].endswith(humaneval.STUB) and t.fail_to_pass == [humaneval.TEST_ID]


def _check(task, factory) -> tuple[bool, bool]:
    fixed = verify_files(task, task.fixed_files(), factory)
    stub = verify_files(task, task.repo_files(), factory)
    return fixed.valid and fixed.passed, stub.valid and not stub.passed


@pytest.mark.parametrize("index", [0, 10, 32, 38, 50, 163])
def test_subset_through_the_verifier(factory, index: int) -> None:
    # 32, 38 and 50 have tests that call helpers defined in the prompt.
    assert _check(humaneval.tasks()[index], factory) == (True, True)


BATCH = """
import json, sys
problems = json.load(open("problems.json"))
bad = []
for p in problems:
    for kind, body in (("canonical", p["canonical_solution"]), ("stub", STUB)):
        ns = {}
        try:
            exec(p["prompt"] + body, ns)
            exec(p["test"], ns)
            ns["check"](ns[p["entry_point"]])
            ok = kind == "canonical"
        except Exception:
            ok = kind == "stub"
        if not ok:
            bad.append((p["task_id"], kind))
print(json.dumps({"checked": len(problems), "bad": bad}))
"""


def test_every_canonical_passes_and_every_stub_fails_in_one_batch(factory) -> None:
    """All 164 problems in one sandboxed process: fast enough for the default suite."""
    import json

    script = f"STUB = {humaneval.STUB!r}\n" + BATCH
    files = {"problems.json": json.dumps(humaneval.problems()), "batch.py": script}
    with factory.create(files=files) as s:
        r = s.exec(["python3", "batch.py"], timeout=300)
    assert r.ok, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"checked": 164, "bad": []}


@pytest.mark.slow
def test_every_problem_through_the_verifier(factory) -> None:
    tasks = humaneval.tasks()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda t: _check(t, factory), tasks))
    bad = [t.instance_id for t, r in zip(tasks, results, strict=True) if r != (True, True)]
    assert bad == []
