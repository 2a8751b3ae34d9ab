"""``bench/e2e_protocol.py``'s plan: the units, counts, seeds and held-out set the protocol names."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from bench import e2e_protocol as e
from gagar.spec import GagarRun


@pytest.fixture(scope="module")
def full() -> dict:
    return e.plan(e.parse(["--dry-run"]))


def test_the_protocol_has_its_units_and_counts(full: dict) -> None:
    proto, runs = full["protocol"], full["runs"]
    assert proto["warm_starts"] >= 10 and len(proto["seeds"]) >= 1
    assert proto["arms"] == ["grpo", "gagar"]
    assert proto["policy"]["parameters"] >= 4.9e8
    assert proto["unit"].startswith("warm start")
    assert proto["primary"]["outcome"] == e.PRIMARY == next(iter(proto["outcomes"]))
    assert "hidden tests" in proto["held_out"]["scored_by"]
    assert proto["held_out"]["samples"] >= 256
    assert proto["held_out"]["evaluated"] >= proto["held_out"]["samples"]
    warm = [r for r in runs if r["kind"] == "warm_start"]
    rl = [r for r in runs if r["kind"] == "rl"]
    passes = [r for r in runs if r["kind"] == "eval"]
    assert len(warm) == 10 and len(rl) == 10 * 1 * 2 and len(passes) == 20 * 3
    # every warm start has each arm once per seed, and its RL runs start from its own policy
    assert Counter((r["warm_start"], r["arm"]) for r in rl) == {
        (k, a): 1 for k in range(10) for a in ("grpo", "gagar")
    }
    # the eval-only passes score the RL run's final policy, with the same seed in both arms
    for r in passes:
        assert r["manifest"]["spec"]["model"]["path"].endswith(
            f"{r['arm']}-w{r['warm_start']}-s{r['seed']}/policy/serving"
        )
        assert r["args"][:1] == ["--eval-only"]
        assert r["manifest"]["spec"]["algorithm"]["seed"] == r["seed"] + r["eval_pass"] * 10_000
    for r in rl:
        assert r["manifest"]["spec"]["model"]["path"].endswith(f"warm{r['warm_start']}-policy")
        assert r["manifest"]["spec"]["algorithm"]["mode"] == r["arm"]
        assert r["args"] == ["--eval-tasks", str(proto["held_out"]["evaluated"])]
    est = proto["estimate"]
    assert est["gpu_hours_one_h100"] > 0 and "not a measurement" in est["how"]
    assert math.isclose(
        est["gpu_hours_one_h100"] * 60,
        10 * est["warm_start_minutes"] + 20 * est["rl_run_minutes"] + 60 * est["eval_pass_minutes"],
        rel_tol=0.01,
    )


def test_seeds_are_distinct_and_every_run_has_its_own_folder(full: dict) -> None:
    runs = full["runs"]
    warm_seeds = [r["warm_seed"] for r in runs if r["kind"] == "warm_start"]
    assert len(set(warm_seeds)) == len(warm_seeds)
    rl_seeds = {r["seed"] for r in runs if r["kind"] == "rl"}
    assert not rl_seeds & set(warm_seeds)  # an RL seed never replays a warm start's draws
    keys = [
        (r["warm_start"], r.get("seed"), r.get("arm"), r["kind"], r.get("eval_pass")) for r in runs
    ]
    assert len(set(keys)) == len(keys)
    assert len({r["out"] for r in runs}) == len(runs)
    for r in runs:
        seed = r["manifest"]["spec"]["algorithm"]["seed"]
        want = r["warm_seed"] if r["kind"] == "warm_start" else r["seed"] + 10_000 * r["eval_pass"]
        assert seed == want


def test_every_manifest_is_a_valid_run_with_dynamic_sampling_off(full: dict) -> None:
    for r in full["runs"]:
        doc = dict(r["manifest"])
        if r["kind"] == "warm_start":  # the placeholder path: the real one comes with --policy
            doc["spec"] = {**doc["spec"], "model": {**doc["spec"]["model"], "path": "/models/q"}}
        run = GagarRun.model_validate(doc)
        assert run.spec.algorithm.dynamic_sampling.enabled is False
        assert run.spec.dataset.held_out_fraction == e.HELD_OUT_FRACTION


def test_the_held_out_set_is_disjoint_from_training_and_expert_tasks(full: dict) -> None:
    held = full["protocol"]["held_out"]
    split = e.check_split(full["runs"][0]["manifest"], held["evaluated"], held["samples"])
    assert split["evaluated"] == split["distinct"] == held["evaluated"]
    assert split["id_overlap"] == 0
    assert split["scored"] >= 256
    # the generator repeats a task now and then: those held-out tasks are named and excluded
    assert split["scored"] == held["evaluated"] - len(split["excluded"])


def test_a_split_too_small_for_the_protocol_is_refused(full: dict) -> None:
    doc = full["runs"][0]["manifest"]
    with pytest.raises(SystemExit, match="evaluates"):
        e.check_split(doc, 10_000, 256)


def test_the_smoke_plan_is_one_warm_start_one_seed_two_arms() -> None:
    smoke = e.plan(e.parse(["--smoke", "--device", "cpu", "--steps", "1"]))
    kinds = Counter(r["kind"] for r in smoke["runs"])
    assert kinds == {"warm_start": 1, "rl": 2, "eval": 2}  # 2 samples per task
    assert smoke["protocol"]["smoke"] is True and smoke["protocol"]["steps"] == 1
    assert smoke["runs"][0]["manifest"]["spec"]["model"]["preset"] == "tiny"


def test_the_analysis_is_per_warm_start_with_seeds_averaged() -> None:
    runs = []
    for k in range(3):
        runs.append({"kind": "warm_start", "warm_start": k, "outcomes": {"resolution": 0.1}})
        for seed in (0, 1):
            for arm, res in (("grpo", 0.2 + k / 10), ("gagar", 0.3 + k * 0.11 + seed / 10)):
                o = {
                    "resolution": res,
                    "tokens": 100.0,
                    "bloated_share": 0.5,
                    "train_pass_rate_area": 0.2,
                }
                runs.append(
                    {"kind": "rl", "warm_start": k, "seed": seed, "arm": arm, "outcomes": o}
                )
    out = e.analyse(runs)
    assert set(out["per_warm_start"]) == {"0", "1", "2"}
    assert out["per_warm_start"]["1"]["gagar"][e.PRIMARY] == pytest.approx(0.46)
    primary = out["tests"][e.PRIMARY]
    assert primary["n"] == 3 and primary["mean_difference"] == pytest.approx(0.16)
    # the primary at α alone, Holm over the secondaries only (issue 50)
    assert primary["primary"] is True and "p_holm" not in primary and primary["alpha"] == 0.05
    secondary = [t for k, t in out["tests"].items() if k != e.PRIMARY]
    assert len(secondary) == 3 and all("p_holm" in t for t in secondary)
    assert "held_out_gain" not in out["tests"]  # the warm start is common: it equals the primary
    assert out["dropped_warm_starts"] == []


def test_the_power_table_falls_with_the_base_rate_and_favours_warm_starts(full: dict) -> None:
    designs = {
        (d["warm_starts"], d["seeds"], d["samples_per_task"]): d
        for d in full["protocol"]["power"]["designs"]
    }
    old, new = designs[(5, 2, 1)]["power"], designs[(10, 1, 4)]["power"]
    assert designs[(10, 1, 4)]["this_protocol"] and designs[(10, 1, 4)]["rl_runs"] == 20
    assert max(old["0.10"], old["0.15"], old["0.20"]) < 0.5  # the issue: not 0.8 at these rates
    assert all(new[r] > old[r] for r in old)  # the same 20 RL runs, more power
    assert designs[(10, 1, 1)]["power"]["0.20"] > old["0.20"]  # a warm start beats a seed
    assert list(new.values()) == sorted(new.values())


def _run(kind: str, w: int, arm: str | None, samples: dict, res: float = 0.2, j: int = 0) -> dict:
    o = {
        "resolution": res,
        "tokens": 100.0,
        "bloated_share": 0.5,
        "train_pass_rate_area": 0.2,
        "samples": samples,
    }
    return {"kind": kind, "warm_start": w, "seed": 0, "arm": arm, "eval_pass": j, "outcomes": o}


def test_the_manipulation_check_and_the_failed_run_rule() -> None:
    same = {"t1": [True, 10], "t2": [False, 30]}
    runs = [_run("warm_start", w, None, {}) for w in range(3)]
    for w in range(3):
        runs.append(_run("rl", w, "grpo", same))
        other = same if w else {"t1": [True, 12], "t2": [False, 30]}  # one task differs at w 0
        runs.append(_run("rl", w, "gagar", other))
    out = e.analyse(runs)
    check = out["manipulation_check"]
    assert check["value"] == pytest.approx((1 / 2) / 3) and check["threshold"] == 0.10
    assert check["passed"] is True
    # warm start 2's gagar run failed twice: the warm start leaves every test, named
    failed = [r for r in runs if not (r["warm_start"] == 2 and r["arm"] == "gagar")]
    out = e.analyse(failed)
    assert out["dropped_warm_starts"] == [2] and out["tests"][e.PRIMARY]["n"] == 2


def test_the_dry_run_prints_the_power_table_and_the_threshold(
    capsys: pytest.CaptureFixture,
) -> None:
    assert e.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "threshold 0.1" in text and "← this protocol" in text and "p=0.20" in text
