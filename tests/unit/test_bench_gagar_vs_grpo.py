"""The comparison benchmark's bookkeeping: manifests per run, per-run summaries, mean ± spread."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import yaml

from gagar.spec import GagarRun

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gagar_vs_grpo", ROOT / "bench" / "gagar_vs_grpo.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _record(step: int, tokens: float, turns: float, **extra) -> dict:
    return {
        "step": step,
        "response_tokens_mean": tokens,
        "turns_mean": turns,
        "pass_rate": 0.5,
        "eligible_groups_ratio": 0.5,
        "trained_groups": 1,
        "gradient_variance": 2.0,
        "step_seconds": 10.0,
        "fallbacks": {},
        **extra,
    }


def test_run_manifests_are_valid_and_differ_only_where_asked():
    base = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    model = {k: v for k, v in base["spec"]["model"].items() if k != "preset"}
    doc = bench.manifest(
        base,
        "grpo-s1",
        model={**model, "path": "/tmp/sft-policy", "sftWarmupSteps": 0},
        algorithm__mode="grpo",
        algorithm__seed=1,
        algorithm__totalSteps=3,
    )
    run = GagarRun.model_validate(doc)
    assert run.metadata.name == "grpo-s1"
    assert (run.spec.algorithm.mode, run.spec.algorithm.seed) == ("grpo", 1)
    assert run.spec.algorithm.total_steps == 3
    assert run.spec.model.path == "/tmp/sft-policy" and run.spec.model.preset is None
    assert run.spec.algorithm.group_size == base["spec"]["algorithm"]["groupSize"]
    assert base["metadata"]["name"] == "local", "the base manifest is not modified"


def test_summary_growth_gain_and_fallbacks():
    run = {
        "records": [
            _record(1, 100, 4, fallbacks={"no_ranking": 1}),
            _record(2, 150, 5, fallbacks={"heuristic_after_timeout": 2}),
        ],
        "held_out": {"resolution_rate": 0.25, "bloated_pass_share": 0.5, "tampering_passes": 1},
    }
    s = bench.summarize(run, sft_rate=0.125)
    assert s["resolution_gain"] == pytest.approx(0.125)
    assert s["length_growth"] == pytest.approx(1.5)
    assert s["turns_growth"] == pytest.approx(1.25)
    assert s["grader_fallbacks"] == 3
    assert s["trained_groups"] == 2


def test_spread_ignores_undefined_growth():
    assert bench.spread([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert bench.spread([2.0, float("nan")]) == (2.0, 0.0)
    assert all(math.isnan(x) for x in bench.spread([float("nan")]))
