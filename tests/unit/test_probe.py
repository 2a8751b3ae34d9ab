"""The probe set: fixed training samples, the same at the start and the end of a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gagar.driver import probe
from gagar.rollout.envs import synthetic


def test_probe_tasks_are_the_first_training_tasks_sampled_per_task_times() -> None:
    tasks = synthetic.generate_many(20, seed=0)
    chosen = probe.probe_tasks(tasks, 64)
    assert len(chosen) == 64
    ids = [t.instance_id for t in chosen]
    assert ids[:4] == [tasks[0].instance_id] * 4 and ids[4] == tasks[1].instance_id
    assert len(set(ids)) == 16 and ids == [t.instance_id for t in probe.probe_tasks(tasks, 64)]
    assert probe.probe_tasks(tasks, 0) == []
    assert len(probe.probe_tasks(tasks[:2], 16)) == 16, "few tasks: cycled, still 16 samples"
    with pytest.raises(ValueError):
        probe.probe_tasks([], 4)


def test_summary_counts_tokens_and_turns_of_passes_only(tmp_path: Path) -> None:
    samples = [
        {"task": "a", "valid": True, "passed": True, "tokens": 100, "turns": 4, "bloated": False},
        {"task": "a", "valid": True, "passed": True, "tokens": 200, "turns": 6, "bloated": True},
        {"task": "b", "valid": True, "passed": False, "tokens": 900, "turns": 9, "bloated": False},
    ]
    out = probe.summary({"tasks": 3, "valid": 3, "resolution_rate": 2 / 3, "samples": samples})
    assert (out["passes"], out["tokens_per_pass"], out["turns_per_pass"]) == (2, 150, 5)
    assert probe.summary({"samples": []})["tokens_per_pass"] is None
    assert probe.load_start(tmp_path) is None
    probe.save_start(tmp_path, out)
    assert probe.load_start(tmp_path) == out
