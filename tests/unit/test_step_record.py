"""The step record: one typed ``StepRecord`` per step, written to ``metrics.jsonl`` with its schema
version and read back equal; read by the report, Prometheus, the trackers and the benches, none of
which may ask for a field the record does not have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gagar.driver import report as rep
from gagar.driver import telemetry
from gagar.driver.record import SCHEMA_VERSION, StepRecord, StepSamples, read_records
from gagar.driver.trackers import scalars
from gagar.metrics import Metrics
from tests.support.records import step_record

# a record as `make run` wrote it before the schema had a version (schema 1): reward_mean, a copy of
# pass_rate, and no schema_version
V1 = {
    "adv_after_abs_max": 0.74, "adv_after_mean": 0.0, "adv_after_std": 0.43,
    "adv_before_abs_max": 0.74, "adv_before_mean": 0.0, "adv_before_std": 0.43,
    "bloated_passes": 0, "bloated_passes_ratio": 0.0, "checkpoint_seconds": 0.0,
    "clip_dual_ratio": 0.0, "clip_high_ratio": 0.0, "clip_low_ratio": 0.0, "clip_ratio": 0.0,
    "eligible_groups_ratio": 0.33, "entropy": 0.31, "fallbacks": {},
    "flagged_turns": {"redundant": 6, "tool_error": 41, "churn": 0}, "generated_tokens": 2500,
    "grad_norm": 0.32, "graded_by": {"heuristic": 1}, "graded_passes": 3,
    "gradient_mean_norm": 0.32, "grading_seconds": 9e-05, "hacks": 0, "invalid": {},
    "kl": 0.0, "lambda_mean": 1.0, "loss": -0.046, "lr": 2e-05, "micro_batches": 1,
    "optimizer_steps": 1, "pass_rate": 0.25, "passes": 3, "policy_version": 1,
    "ratio_max": 1.0, "ratio_mean": 1.0, "response_tokens_mean": 208.3, "reward_mean": 0.25,
    "rollout_logp_abs_diff": 0.0036, "rollout_policy_version": 0, "rollout_seconds": 11.0,
    "rollout_tokens_per_second": 226.8, "sampled_groups": 3, "sampling_rounds": 2,
    "shortfall": 1,
    "stage_seconds": {"rollout": 11.0, "grading_wait": 9e-05, "update": 1.08, "sync": 0.08,
                      "checkpoint": 0.0, "other": 0.0019},
    "staleness_versions": 0, "step": 1, "step_seconds": 12.19, "sync_seconds": 0.08,
    "tampered": 0, "tokens_trained": 666, "trained_groups": 1, "training_seconds": 1.08,
    "training_tokens_per_second": 615.5, "turns_mean": 5.58, "valid_trajectories": 12,
}  # fmt: skip


def _full() -> StepRecord:
    return step_record(
        3,
        loss=0.5,
        lr=1e-4,
        gradient_variance=2.0,
        fallbacks={"timeout": 1},
        invalid={"max_turns": 2},
        graded_by={"heuristic": 2},
        grader_skipped={"unsafe_path": 1},
        flagged_turns={"redundant": 1, "tool_error": 2, "churn": 0},
        adv_after_abs_max=1.5,
        stage_seconds={"rollout": 6.0, "update": 2.0, "sync": 0.5, "other": 1.5},
    )


def test_a_record_round_trips_through_jsonl_with_its_schema_version(tmp_path: Path) -> None:
    record = _full()
    log = tmp_path / "metrics.jsonl"
    rep.append_jsonl(log, record)
    rep.append_jsonl(log, step_record(4))
    line = json.loads(log.read_text().splitlines()[0])
    assert line["schema_version"] == SCHEMA_VERSION
    # flat on disk, under the names docs/trainer.md lists
    assert line["pass_rate"] == 0.5 and line["adv_after_abs_max"] == 1.5 and line["loss"] == 0.5
    assert line["flagged_turns"] == {"redundant": 1, "tool_error": 2, "churn": 0}
    assert "reward_mean" not in line, "the copy of pass_rate is gone"
    assert read_records(log) == [record, step_record(4)]


def test_a_schema_1_record_is_read_without_its_copy_of_pass_rate(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps(V1) + "\n")
    (record,) = read_records(log)
    assert record.rollouts.pass_rate == 0.25 and record.learner.tokens_trained == 666
    assert record.grading.adv_after.std == 0.43 and record.stage_seconds.rollout == 11.0
    assert "reward_mean" not in record.flat()
    assert {k for k in V1 if k != "reward_mean"} <= set(record.flat())


def test_a_schema_2_record_reads_the_verification_counts_as_zero(tmp_path: Path) -> None:
    flat = _full().flat()
    v2 = {k: v for k, v in flat.items() if k not in ("verifications", "verdicts_shared")}
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({**v2, "schema_version": 2}) + "\n")
    (record,) = read_records(log)
    assert record.rollouts.verifications == 0 and record.rollouts.verdicts_shared == 0
    assert record.flat() | {"verifications": 0, "verdicts_shared": 0} == record.flat()
    with pytest.raises(ValueError, match="lacks verdicts_shared, verifications"):
        StepRecord.from_flat({**v2, "schema_version": SCHEMA_VERSION})


def test_a_schema_3_record_reads_the_grader_quality_counts_as_zero(tmp_path: Path) -> None:
    quality = ("usable_groups", "heuristic_pairs", "heuristic_agreeing_pairs", "audited_groups")
    quality += ("audit_unusable", "audit_pairs", "audit_consistent_pairs")
    flat = _full().flat() | dict.fromkeys(quality, 2)
    v3 = {k: v for k, v in flat.items() if k not in quality}
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({**v3, "schema_version": 3}) + "\n")
    (record,) = read_records(log)
    assert all(getattr(record.grading, k) == 0 for k in quality)
    with pytest.raises(ValueError, match="lacks audit_consistent_pairs"):
        StepRecord.from_flat({**v3, "schema_version": SCHEMA_VERSION})


@pytest.mark.parametrize(
    ("line", "error"),
    [
        # schema 3 has no reward_mean, and writes every field (null where the step has none)
        ({**_full().flat(), "reward_mean": 0.5}, "reward_mean"),
        ({k: v for k, v in _full().flat().items() if k != "tis_weight"}, "lacks tis_weight"),
        ({**V1, "surprise": 1}, "surprise"),
        ({**V1, "schema_version": 99}, "schema 99"),
        ({k: v for k, v in V1.items() if k != "passes"}, "passes"),
    ],
)
def test_a_line_that_is_not_a_record_names_the_file_and_line(tmp_path: Path, line, error) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps(V1) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=rf"(?s)metrics.jsonl:2: not a step record.*{error}"):
        read_records(log)


def test_a_consumer_cannot_read_a_field_the_record_does_not_have() -> None:
    record = _full()
    with pytest.raises(KeyError, match="reward_mean"):
        rep.series([record], "reward_mean")
    with pytest.raises(AttributeError):
        _ = record.reward_mean  # type: ignore[attr-defined]  # the point of the test
    with pytest.raises(ValueError, match="reward_mean"):
        record.rollouts = record.rollouts.model_validate({"reward_mean": 0.5})


def test_every_plot_and_summary_row_reads_fields_the_record_has(tmp_path: Path) -> None:
    records = [_full(), step_record(4, gradient_noise_trace=1.0, gradient_signal_sq=2.0)]
    for keys, _ in rep.PLOTS.values():
        for key in keys:
            rep.series(records, key)  # KeyError on a field the record does not have
    report = rep.write_report(tmp_path, records, {"run": "t", "mode": "gagar", "policy_version": 4})
    assert report["last"] == records[-1].flat() and report["gradient_noise_scale_pooled"] == 0.5
    assert all((tmp_path / name).exists() for name in report["plots"])
    rows = dict(rep.summary_rows(report, records))
    assert rows["step time, s"] == "10.0 mean"


def test_prometheus_and_the_trackers_read_the_record() -> None:
    metrics = Metrics(CollectorRegistry(), "trainer", "rollout")
    record = _full()
    samples = StepSamples(adv_before=[0.5], adv_after=[1.5], lambdas=[0.8], response_tokens=[7])
    rep.export(metrics, "t", record, samples)
    telemetry.record_step(metrics, "t", [], record)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"run": "t", **labels})

    assert value("gagar_pass_rate_ratio") == 0.5 and value("gagar_loss") == 0.5
    assert value("gagar_advantage_abs_max", stage="after") == 1.5
    assert value("gagar_grader_fallbacks_total", reason="timeout") == 1
    assert value("gagar_redundant_actions_total", kind="tool_error") == 2
    assert value("gagar_graded_groups_total") == 2
    assert value("gagar_trainer_stage_duration_seconds_sum", stage="rollout") == 6.0
    assert value("gagar_kl") is None, "a field the step lacks leaves its gauge unset"
    values = scalars(record.flat())
    assert values["pass_rate"] == 0.5 and values["fallbacks/timeout"] == 1.0
    assert values["stage_seconds/update"] == 2.0 and "kl" not in values


def test_a_metric_read_as_another_kind_is_refused() -> None:
    metrics = Metrics(CollectorRegistry(), "trainer")
    with pytest.raises(TypeError, match="gagar_advantage is a histogram, not a gauge"):
        metrics.gauge("gagar_advantage")
