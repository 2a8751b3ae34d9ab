"""The probe set: fixed training samples, the same at the start and the end of a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gagar.driver import probe, sft
from gagar.rollout.envs import synthetic
from gagar.spec import GagarRun


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


def _local(**changes: dict) -> GagarRun:
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "examples" / "local.yaml").read_text())
    for block, values in changes.items():
        doc["spec"][block] = {**json.loads(json.dumps(doc["spec"].get(block, {}))), **values}
    return GagarRun.model_validate(doc)


def test_the_start_key_follows_weights_and_settings_not_the_algorithm(tmp_path: Path) -> None:
    weights = tmp_path / "serving"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\0" * 1000)
    (weights / "config.json").write_text("{}")
    base = probe.start_key(_local(), weights, 64)
    assert base == probe.start_key(_local(), weights, 64)
    # the arms of a comparison: another mode, seed, lr, advantages -> the same start score
    same = _local(algorithm={"mode": "grpo", "seed": 7, "optimizer": {"lr": 1e-3}})
    assert probe.start_key(same, weights, 64) == base
    # what the start score depends on
    assert probe.start_key(_local(), weights, 32) != base
    hot = _local(
        rollout={
            "agent": {**_local().spec.rollout.agent.model_dump(by_alias=True), "temperature": 0.5}
        }
    )
    assert probe.start_key(hot, weights, 64) != base
    assert probe.start_key(_local(dataset={"heldOutFraction": 0.5}), weights, 64) != base
    (weights / "model.safetensors").write_bytes(b"\0" * 999 + b"\1")
    assert probe.start_key(_local(), weights, 64) != base, "one changed byte of the weights"


def test_a_cached_start_comes_back_with_its_trajectories(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path / "cache"))
    rollouts = tmp_path / "a" / "rollouts" / "probe_start.jsonl"
    rollouts.parent.mkdir(parents=True)
    rollouts.write_text('{"task": "t"}\n')
    assert probe.cached_start("k1", rollouts) is None
    probe.store_start("k1", {"pass_rate": 0.25, "samples": []}, rollouts)
    other = tmp_path / "b" / "rollouts" / "probe_start.jsonl"
    hit = probe.cached_start("k1", other)
    assert hit == {"pass_rate": 0.25, "samples": [], "cached": "k1"}
    assert other.read_text() == '{"task": "t"}\n'
    assert probe.cached_start("k2", other) is None
    monkeypatch.setattr(probe, "CACHE_KEEP", 2)
    for key in ("k2", "k3"):
        probe.store_start(key, {"pass_rate": 0.0}, rollouts)
    assert sorted(p.name for p in probe.cache_root().iterdir()) == ["k2", "k3"], "pruned to 2"


def test_the_start_key_s_code_includes_the_grader_that_flags_bloat(tmp_path: Path) -> None:
    pkg = tmp_path / "gagar"
    for rel in ("driver/loop.py", "grader/heuristic.py", "wire.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("x = 1\n")
    warm, start = sft.code_hash(pkg), sft.code_hash(pkg, probe.KEY_CODE)
    (pkg / "grader" / "heuristic.py").write_text("x = 2\n")
    assert sft.code_hash(pkg) == warm, "the warm start does not depend on the grader"
    assert sft.code_hash(pkg, probe.KEY_CODE) != start
