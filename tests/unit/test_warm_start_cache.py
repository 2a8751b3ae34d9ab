"""The per-machine cache of warm-started policies: its key, a hit, and what invalidates it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gagar.driver import sft
from gagar.spec import GagarRun

ROOT = Path(__file__).resolve().parents[2]
LOCAL = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())


def _run(**model) -> GagarRun:
    doc = json.loads(json.dumps(LOCAL))
    doc["spec"]["model"].update(model)
    return GagarRun.model_validate(doc)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path / "cache"))

    def fake_save(model, out, side_files_from):  # the weights of "model", and the side files
        Path(out).mkdir(parents=True)
        (Path(out) / "model.safetensors").write_text(model)
        (Path(out) / "config.json").write_text((Path(side_files_from) / "config.json").read_text())

    import gagar.trainer.model as tm

    monkeypatch.setattr(tm, "save_hf_checkpoint", fake_save)
    return tmp_path / "cache" / "warm-start"


def test_the_key_covers_what_makes_the_warm_start() -> None:
    base = sft.warm_start_key(_run())
    assert base == sft.warm_start_key(_run()), "stable"
    changed = [
        _run(sftWarmupSteps=399),
        _run(copyCurriculumSteps=10),
        _run(sftExpertStyles={"bloated": 0.9}),
        _run(sftLr=1e-4),
        _run(sftExpertTasks=32),
        _run(dtype="float32"),
    ]
    doc = json.loads(json.dumps(LOCAL))
    doc["spec"]["algorithm"]["seed"] = 1
    changed.append(GagarRun.model_validate(doc))
    doc = json.loads(json.dumps(LOCAL))
    doc["spec"]["dataset"]["sources"][0]["size"] = 65
    changed.append(GagarRun.model_validate(doc))
    keys = {sft.warm_start_key(r) for r in changed}
    assert base not in keys and len(keys) == len(changed)
    # the RL-only settings do not make another warm start
    doc = json.loads(json.dumps(LOCAL))
    doc["spec"]["algorithm"].update(totalSteps=99, mode="grpo", groupSize=8)
    assert sft.warm_start_key(GagarRun.model_validate(doc)) == base


def test_the_code_is_part_of_the_key(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "driver").mkdir(parents=True)
    (pkg / "driver" / "sft.py").write_text("A = 1\n")
    (pkg / "spec.py").write_text("")
    before = sft.code_hash(pkg)
    assert sft.code_hash(pkg) == before
    (pkg / "driver" / "sft.py").write_text("A = 2\n")
    assert sft.code_hash(pkg) != before
    monkeypatch.setattr(sft, "code_hash", lambda: "another version")
    key = sft.warm_start_key(_run())
    monkeypatch.undo()
    assert key != sft.warm_start_key(_run())


def test_store_then_restore_is_a_hit_and_another_spec_misses(cache, tmp_path) -> None:
    run = _run()
    policy = tmp_path / "run1" / "policy" / "base"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text('{"tiny": true}')
    assert sft.restore_warm_start(run, tmp_path / "run2" / "base") is None, "empty cache"
    entry = sft.store_warm_start(run, "warm weights", policy, {"sft_steps": 400})
    assert entry.parent == cache and not list(cache.glob("*.partial*"))
    dest = tmp_path / "run2" / "policy" / "base"
    dest.parent.mkdir(parents=True)
    assert sft.restore_warm_start(run, dest) == {"sft_steps": 400}
    assert (dest / "model.safetensors").read_text() == "warm weights"
    assert sft.cached_summary(run, dest) == {"sft_steps": 400, "cached": True}
    other = _run(sftExpertStyles={"bloated": 0.9})
    assert sft.cached_summary(other, dest) is None, "the folder is not the other spec's warm start"
    assert sft.restore_warm_start(other, tmp_path / "run3") is None
    assert sft.cached_summary(run, policy) is None, "no marker: not a warm start"


def test_the_cache_keeps_its_newest_entries(cache, tmp_path, monkeypatch) -> None:
    policy = tmp_path / "p"
    policy.mkdir()
    (policy / "config.json").write_text("{}")
    runs = [_run(sftWarmupSteps=s) for s in range(1, sft.CACHE_KEEP + 3)]
    for r in runs:
        sft.store_warm_start(r, "w", policy, {})
    kept = {p.name for p in cache.iterdir()}
    assert len(kept) == sft.CACHE_KEEP
    assert sft.warm_start_key(runs[-1]) in kept and sft.warm_start_key(runs[0]) not in kept
