"""The comparison bench's bookkeeping: arms, manifests, per-run numbers, tests, plots, JSON shape."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from gagar.driver import advantages as adv_mod
from gagar.driver.record import StepRecord
from gagar.rollout.agent import Trajectory
from gagar.spec import GagarRun
from gagar.wire import Ranking, TiedGroup
from tests.support.records import step_record

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gagar_vs_grpo", ROOT / "bench" / "gagar_vs_grpo.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
BASE = yaml.safe_load((ROOT / "examples" / "gagar-vs-grpo.yaml").read_text())


def _record(step: int, pass_rate: float = 0.5, **extra) -> StepRecord:
    return step_record(
        step,
        **{
            "pass_rate": pass_rate,
            "bloated_passes_ratio": 0.25,
            "graded_by": {"heuristic": 1},
            "response_tokens_mean": 100.0,
            "turns_mean": 4.0,
            "eligible_groups_ratio": 0.5,
            "trained_groups": 1,
            "gradient_variance": 2.0,
            "gradient_mean_norm": 0.5,
            "step_seconds": 10.0,
            **extra,
        },
    )


def _probe(rate: float, tokens: int, n: int = 8, passed: list[bool] | None = None) -> dict:
    passed = passed if passed is not None else [i < round(rate * n) for i in range(n)]
    samples = [
        {
            "task": f"t{i // 4}",
            "valid": True,
            "passed": p,
            "tokens": tokens,
            "turns": 4,
            "bloated": False,
        }
        for i, p in enumerate(passed)
    ]
    return {
        "tasks": n, "valid": n, "pass_rate": sum(passed) / n, "passes": sum(passed),
        "bloated_pass_share": 0.0, "tokens_per_pass": tokens if any(passed) else None,
        "turns_per_pass": 4 if any(passed) else None, "samples": samples,
    }  # fmt: skip


def test_every_arm_is_a_valid_manifest_that_differs_only_in_its_algorithm() -> None:
    model = {k: v for k, v in BASE["spec"]["model"].items() if k not in bench.SFT_RUN_ONLY}
    docs = {}
    for arm in bench.ARMS:
        doc = bench.arm_spec(
            bench.manifest(
                BASE, f"{arm}-s1", model={**model, "path": "/tmp/start", "sftWarmupSteps": 0},
                algorithm__seed=1, algorithm__totalSteps=3,
            ),
            arm,
        )  # fmt: skip
        run = GagarRun.model_validate(doc)
        assert run.spec.model.path == "/tmp/start" and run.spec.model.sft_expert_styles is None
        assert (run.spec.algorithm.seed, run.spec.algorithm.total_steps) == (1, 3)
        docs[arm] = run.spec.algorithm
    assert docs["grpo"].mode == "grpo" and docs["gagar"].mode == "gagar"
    red, shp = docs["gagar-redistribution"], docs["gagar-shaping"]
    assert not red.length_penalty.enabled and not red.segment_penalty.enabled
    assert red.redistribution == docs["gagar"].redistribution
    assert shp.length_penalty.enabled and shp.segment_penalty.enabled
    q = shp.redistribution.quality_factors
    assert (q.t1_first, q.t1_other, q.t2_high, q.t2_low, q.t3) == (1.0,) * 5
    assert BASE["metadata"]["name"] == "gagar-vs-grpo", "the base manifest is not modified"


def _group() -> tuple[list[adv_mod.Rollout], Ranking]:
    def roll(passed: bool, tokens: int) -> adv_mod.Rollout:
        mask = [0] + [1] * (tokens - 1)
        t = Trajectory([1] * tokens, [0.0] * tokens, mask, 1, [], exit_reason="submitted")
        return adv_mod.Rollout(t, passed, True)

    rollouts = [roll(True, 10), roll(True, 30), roll(True, 12), roll(False, 20)]
    ranking = Ranking(
        grader="heuristic",
        tied_groups=[TiedGroup(tier="T1", members=[0, 2]), TiedGroup(tier="T2", members=[1])],
    )
    return rollouts, ranking


def test_the_ablations_switch_off_exactly_their_half() -> None:
    """Shaping only: the redistribution is the identity; redistribution only: advantages are the
    redistributed ones, with no length penalty."""
    rollouts, ranking = _group()
    algs = {a: GagarRun.model_validate(bench.arm_spec(BASE, a)).spec.algorithm for a in bench.ARMS}
    out = {a: adv_mod.group_advantages([rollouts], [ranking], alg) for a, alg in algs.items()}
    shaping = out["gagar-shaping"]
    assert torch.allclose(shaping.adv, shaping.result.adv_before)
    red = out["gagar-redistribution"]
    grpo = out["grpo"].adv
    assert torch.allclose(red.result.adv_before, grpo), "no length penalty before GRPO"
    assert not torch.allclose(red.adv, grpo), "the grader's ranking moves the passes' advantages"
    assert red.adv[0, 0] > red.adv[0, 1], "the T1 pass above the T2 pass"
    assert torch.isclose(red.adv[0, :3].sum(), grpo[0, :3].sum()), "sum-preserving"


def test_series_leave_out_what_was_not_measured() -> None:
    records = [
        _record(1),
        _record(2, trained_groups=0, gradient_variance=0.0),
        _record(3, graded_by={}),
    ]
    s = bench.step_series(records)
    assert s["gradient_variance"] == [2.0, None, 2.0]
    assert s["scale_free_variance"] == [8.0, None, 8.0]
    assert s["bloated_passes_ratio"] == [0.25, 0.25, None], "ungraded (GRPO today): not a 0"


def test_summary_of_one_run() -> None:
    records = [_record(i, pass_rate=0.1 * i) for i in range(1, 11)]
    probe = {"start": _probe(0.25, 100), "end": _probe(0.5, 120)}
    s = bench.summarize(bench.step_series(records), probe)
    assert s["pass_rate_area"] == pytest.approx(0.55)
    assert s["pass_rate_last"] == pytest.approx(0.8)
    assert (s["probe_start"], s["probe_end"], s["probe_gain"]) == (0.25, 0.5, 0.25)
    assert s["probe_length_growth"] == pytest.approx(1.2)
    assert s["tokens_per_pass"] == 120 and s["scale_free_variance"] == 8.0
    assert math.isnan(bench.summarize(bench.step_series(records), {})["probe_end"])


def _fake_train(tmp_results: dict):
    """A ``gagar_train`` that writes what a run would: GAGAR's probe passes more samples."""

    def fake(doc, out, *args):
        name = doc["metadata"]["name"]
        if name == "gagar-shaping-s1":
            raise bench.RunFailed("exit 1 (log: x.log): engine died")
        (out / "policy" / "serving").mkdir(parents=True)
        (out / "policy" / "serving" / "config.json").write_text("{}")
        report = {"warm_start": {"sft_steps": 2}}
        if name != "sft":
            arm, seed = name.rsplit("-s", 1)
            good = {"grpo": 2, "gagar": 6}.get(arm, 4)
            end = [i < good for i in range(8)]
            report["probe"] = {"start": _probe(0.25, 100), "end": _probe(0, 110, passed=end)}
            rate = 0.2 + 0.1 * (arm == "gagar") + 0.01 * int(seed)
            records = [_record(i, pass_rate=rate) for i in (1, 2)]
            (out / "metrics.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
            tmp_results.setdefault("args", []).append(args)
        (out / "report.json").write_text(json.dumps(report))
        return 1.0

    return fake


def test_the_bench_end_to_end_on_fake_runs(tmp_path, monkeypatch, capsys) -> None:
    seen: dict = {}
    monkeypatch.setattr(bench, "gagar_train", _fake_train(seen))
    monkeypatch.setattr(bench, "RESULTS", tmp_path)  # no replay result there
    out = tmp_path / "r.json"
    argv = ["--seeds", "0", "1", "2", "--steps", "2", "--probe", "8"]
    argv += ["--work", str(tmp_path / "work"), "--json", str(out)]
    assert bench.main(argv) == 1, "a run failed: exit 1"
    data = json.loads(out.read_text())
    assert set(data) >= {"protocol", "arms", "tests", "replay"}
    p = data["protocol"]
    assert (p["seeds"], p["steps"], p["trajectories_per_step"], p["probe_samples"]) == (
        [0, 1, 2],
        2,
        16,
        8,
    )
    assert p["policy"]["preset"] == "tiny" and p["policy"]["sftExpertStyles"]["bloated"] == 0.4
    assert [len(data["arms"][a]) for a in bench.ARMS] == [3, 3, 3, 2]
    assert data["failed"] == [
        {"seed": 1, "arm": "gagar-shaping", "error": "exit 1 (log: x.log): engine died"}
    ]
    assert all("--probe" in a and "8" in a for a in seen["args"])
    run0 = data["arms"]["gagar"][0]
    assert (
        set(run0) >= {"seed", "steps", "probe", "summary"} and len(run0["steps"]["pass_rate"]) == 2
    )
    t = data["tests"]
    assert set(t) >= {"pass_rate_area", "probe_gain", "scale_free_variance", "probe_end_discordant"}
    assert (t["pass_rate_area"]["n"], t["pass_rate_area"]["p_value"]) == (3, 0.25)
    assert t["pass_rate_area"]["vs"]["gagar-shaping"]["pairs"] == 2
    # no test pairs steps: a step series is tested through its per-run summary only
    assert not any(k.endswith("_per_step") for k in t)
    # Holm over every test of the file: each p_holm at least its p, the smallest times the family
    family = [v for v in t.values() if "p_value" in v]
    family += [w for v in t.values() for w in v.get("vs", {}).values()]
    assert all(v["p_holm"] >= v["p_value"] for v in family)
    smallest = min(family, key=lambda v: v["p_value"])
    assert smallest["p_holm"] == pytest.approx(min(1.0, len(family) * smallest["p_value"]))
    # probe samples: gagar passes 4 more of 8 in each of 3 seeds; counted, not tested
    assert t["probe_end_discordant"]["gagar"] == {"only_arm": 12, "only_baseline": 0}
    assert "p_value" not in t["probe_end_discordant"]["gagar"]
    assert data["replay"]["groups"] == 0
    s = data["summary"]["gagar"]["probe_end"]
    assert (s["mean"], s["n"]) == (0.75, 3)
    pngs = sorted(x.name for x in (tmp_path / "r").iterdir())
    assert (
        "pass_rate.png" in pngs
        and "probe_pass_rate.png" in pngs
        and "scale_free_variance.png" in pngs
    )
    table = (tmp_path / "r.md").read_text()
    assert "| probe pass rate at the end | 0.250 [0.250, 0.250] | 0.750 [0.750, 0.750]" in table
    assert "failed, left out: gagar-shaping seed 1" in " ".join(capsys.readouterr().out.split())


def test_quick_fills_in_small_defaults_and_flags_win() -> None:
    args = bench.parse(["--quick", "--steps", "3"])
    assert (args.seeds, args.steps, args.probe, args.sft_steps) == ([0], 3, 4, 2)
    args = bench.parse([])
    assert (args.seeds, args.probe, args.steps) == ([0, 1, 2], 64, None)


def test_the_replay_result_is_embedded(tmp_path) -> None:
    (tmp_path / "gagar_replay-2026-01-01.json").write_text(json.dumps({
        "groups": 3, "p_value": 0.5, "means": {}, "tests": {}, "protocol": {}, "arms": {"x": 1}}))  # fmt: skip
    (tmp_path / "gagar_replay-2026-02-01.json").write_text(json.dumps({
        "groups": 24, "p_value": 0.01, "means": {}, "tests": {}, "protocol": {}, "arms": {}}))  # fmt: skip
    replay = bench.newest_replay(tmp_path)
    assert (replay["groups"], replay["p_value"], replay["file"]) == (
        24,
        0.01,
        "gagar_replay-2026-02-01.json",
    )
    assert bench.newest_replay(tmp_path / "none") is None


def test_finish_takes_in_a_replay_that_finished_after_the_arms(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bench, "gagar_train", _fake_train({}))
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    out = tmp_path / "r.json"
    argv = ["--seeds", "0", "--steps", "2", "--probe", "8", "--arms", "grpo", "gagar"]
    assert bench.main([*argv, "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["replay"]["groups"] == 0
    means = {a: {"gap_change": {"mean": 0.5}} for a in ("grpo", "gagar")}
    (tmp_path / "gagar_replay-2026-01-01.json").write_text(json.dumps({
        "groups": 24, "p_value": 0.03, "means": means, "tests": {}, "protocol": {}}))  # fmt: skip
    assert bench.main(["--finish", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["replay"]["groups"] == 24
    assert "over 24 groups | 0.5 | 0.5 | 0.03 |" in (tmp_path / "r.md").read_text()
