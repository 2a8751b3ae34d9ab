"""bench/mined_scores.py: the do-nothing policy and the reference fixes scored per package from
the verifier's word, a task that scores otherwise named."""

from __future__ import annotations

from bench.mined_scores import first_per_package, score
from gagar.rollout.envs.task import Task


def _task(pkg: str, i: int) -> Task:
    return Task(
        instance_id=f"{pkg}-1.0.x.{i}",
        problem_statement="tests fail",
        files={"m.py": "x = 0\n"},
        fail_to_pass=["t.py::a"],
        patch="diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 0\n+x = 1\n",
        metadata={"package": pkg},
    )


def test_do_nothing_scores_0_and_the_reference_1_per_package() -> None:
    tasks = [_task("parse", 0), _task("parse", 1), _task("toolz", 0)]
    fixed = lambda task, files: files["m.py"] == b"x = 1\n"  # noqa: E731
    result = score(tasks, fixed)
    assert {p: (r["do_nothing"]["score"], r["reference"]["score"]) for p, r in result.items()} == {
        "parse": (0.0, 1.0),
        "toolz": (0.0, 1.0),
    }
    broken = score(tasks, lambda task, files: True)  # a verifier that passes anything
    assert broken["parse"]["do_nothing"] == {"score": 1.0, "passed": 2, "wrong": [
        "parse-1.0.x.0", "parse-1.0.x.1"
    ]}  # fmt: skip


def test_first_per_package_keeps_the_order() -> None:
    tasks = [_task("a", 0), _task("b", 0), _task("a", 1), _task("a", 2)]
    assert [t.instance_id for t in first_per_package(tasks, 2)] == [
        "a-1.0.x.0",
        "b-1.0.x.0",
        "a-1.0.x.1",
    ]
