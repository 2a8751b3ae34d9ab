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
    model = {k: v for k, v in base["spec"]["model"].items() if k not in bench.SFT_RUN_ONLY}
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
    # a step that trained nothing has no gradient: it does not pull the variance down
    run["records"].append(_record(3, 150, 5, trained_groups=0, gradient_variance=0.0))
    assert bench.summarize(run, sft_rate=0.125)["gradient_variance"] == 2.0


def test_spread_ignores_undefined_growth():
    assert bench.spread([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert bench.spread([2.0, float("nan")]) == (2.0, 0.0)
    assert all(math.isnan(x) for x in bench.spread([float("nan")]))


def test_a_failed_run_is_named_and_left_out_and_the_rest_is_kept(tmp_path, monkeypatch, capsys):
    """A run that exits non-zero (say its engine died in the evaluation) costs only that run:
    the others are summarized, the failure is in the table and the JSON, the exit status is 1."""
    import json
    import sys

    def fake_train(doc, out, *args):
        name = doc["metadata"]["name"]
        if name == "gagar-s1":
            raise bench.RunFailed("exit 1 (log: gagar-s1.log): held-out evaluation failed")
        (out / "policy" / "serving").mkdir(parents=True)
        rate = {"sft": 0.125, "grpo": 0.25, "gagar": 0.5}[name.split("-")[0]]
        held = {"tasks": 8, "valid": 8, "resolution_rate": rate}
        (out / "report.json").write_text(json.dumps({"held_out": held}))
        if name != "sft":
            records = [_record(1, 100, 4), _record(2, 120, 4)]
            (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return 1.0

    monkeypatch.setattr(bench, "gagar_train", fake_train)
    result = tmp_path / "result.json"
    argv = ["gagar_vs_grpo.py", "--manifest", str(ROOT / "examples" / "local.yaml")]
    argv += ["--seeds", "0", "1", "--work", str(tmp_path / "work"), "--json", str(result)]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "failed, left out: gagar seed 1" in out
    data = json.loads(result.read_text())
    assert data["finished"] and [f["mode"] for f in data["failed"]] == ["gagar"]
    assert sorted((r["mode"], r["seed"]) for r in data["runs"]) == [
        ("gagar", 0), ("grpo", 0), ("grpo", 1)
    ]  # fmt: skip
    assert data["summary"]["gagar"]["resolution_rate"] == {"mean": 0.5, "sd": 0.0}
    assert data["summary"]["grpo"]["resolution_gain"]["mean"] == pytest.approx(0.125)
