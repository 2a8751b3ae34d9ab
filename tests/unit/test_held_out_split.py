"""The held-out split never scores a copy of a training task (the synthetic generator repeats
one now and then: two differently named tasks with the same repository and tests)."""

from __future__ import annotations

import json
from pathlib import Path

from gagar.driver.components import load_datasets
from gagar.rollout.envs import synthetic
from gagar.spec import DatasetSpec


def _copies(tmp_path: Path) -> Path:
    task = synthetic.generate_many(1, seed=3)[0]
    rows = [task.model_dump(mode="json") | {"instance_id": f"copy-{i}"} for i in range(4)]
    other = synthetic.generate_many(1, seed=11)[0].model_dump(mode="json")
    assert other["files"] != rows[0]["files"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, other]))
    return path


def test_a_held_out_copy_of_a_training_task_is_left_out(tmp_path: Path) -> None:
    path = _copies(tmp_path)
    spec = DatasetSpec.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(path)}], "heldOutFraction": 0.4}
    )
    train, held = load_datasets(spec)
    keys = {t.content_key() for t in train}
    assert len(train) == 3  # 5 tasks, 2 held out before the check
    assert all(t.content_key() not in keys for t in held)
    assert {t.instance_id for t in held} <= {"synthetic-11", *(f"copy-{i}" for i in range(4))}


def test_the_content_key_ignores_the_name_and_sees_the_tests() -> None:
    task = synthetic.generate_many(1, seed=3)[0]
    renamed = task.model_copy(update={"instance_id": "another"})
    assert renamed.content_key() == task.content_key()
    tests = dict(task.test_files)
    first = next(iter(tests))
    changed = task.model_copy(update={"test_files": {**tests, first: tests[first] + "\n# x\n"}})
    assert changed.content_key() != task.content_key()


def test_the_content_key_sees_the_image_its_sessions_run_in() -> None:
    """Two SWE-bench rows alike but for ``image_name`` run their tests in different packages:
    two tasks, not one deduplicated away; an environment wins over the image (the image is not
    used), so there the image leaves the key alone."""
    task = synthetic.generate_many(1, seed=3)[0]
    one = task.model_copy(update={"image": "swebench/sweb.eval.x86_64.a:latest"})
    other = task.model_copy(update={"image": "swebench/sweb.eval.x86_64.b:latest"})
    assert len({task.content_key(), one.content_key(), other.content_key()}) == 3
    env = {"environment": "db"}
    assert (
        one.model_copy(update=env).content_key()
        == other.model_copy(update=env).content_key()
        == task.model_copy(update=env).content_key()
    )
