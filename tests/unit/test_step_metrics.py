"""Step metrics that tell the truth: a measured checkpoint time in the record on disk (appended
before the checkpoint, rewritten after it), and no gradient variance for a step without one, in
the plots and in Prometheus alike."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from gagar.driver import loop
from gagar.driver import report as rep
from gagar.driver.record import StepRecord, StepSamples, read_records
from gagar.metrics import Metrics
from gagar.spec import GagarRun
from gagar.trainer.checkpoint import CheckpointManager, truncate_jsonl
from tests.support.records import step_record

SAVE_S = 0.05


def _ctx(tmp: Path, interval: int, total: int) -> SimpleNamespace:
    run = GagarRun.model_validate({
        "metadata": {"name": "t"},
        "spec": {"model": {"preset": "tiny"}, "algorithm": {"totalSteps": total},
                 "trainer": {"checkpoint": {"intervalSteps": interval}}},
    })  # fmt: skip
    ckpt = CheckpointManager(tmp / "checkpoints")
    log = tmp / "metrics.jsonl"
    seen: list[list[int]] = []

    def call(name: str, step: int, state: dict) -> None:
        assert name == "save"
        # the rule a resume relies on: the step's record is on disk before its checkpoint
        seen.append([json.loads(line)["step"] for line in log.read_text().splitlines()])
        time.sleep(SAVE_S)
        ckpt.save(step, {"x": 1}, state)

    return SimpleNamespace(
        run=run, out=tmp, step=0, version=0, alg=run.spec.algorithm, ckpt=ckpt, call=call,
        sampler=SimpleNamespace(state=lambda: {}), sampler_state=None,
        metrics=Metrics(CollectorRegistry(), "trainer"),
        trackers=SimpleNamespace(log_step=lambda record: None), seen=seen,
    )  # fmt: skip


def _record(step: int, **flat: object) -> StepRecord:
    return step_record(step, **{"step_seconds": 1.0, "checkpoint_seconds": None, **flat})


def test_checkpoint_seconds_is_measured_in_the_record_on_disk(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, interval=2, total=3)
    returned = []
    for step in (1, 2, 3):
        ctx.step = step
        returned.append(loop._finish_step(ctx, _record(step), StepSamples()))
    assert ctx.seen == [[1, 2], [1, 2, 3]]  # steps 2 and 3 (the last) checkpoint
    on_disk = read_records(tmp_path / "metrics.jsonl")
    assert [r.step for r in on_disk] == [1, 2, 3]
    assert on_disk[0].checkpoint_seconds == 0.0
    assert all((r.checkpoint_seconds or 0.0) >= SAVE_S for r in on_disk[1:])
    assert [r.checkpoint_step for r in returned] == [0, 2, 3]
    assert [r.checkpoint_step for r in on_disk] == [0, 2, 3]  # rewritten after the save
    assert returned == on_disk
    # the stages add up to the step, the checkpoint included
    for r in on_disk:
        assert sum(r.stage_seconds.model_dump().values()) == pytest.approx(r.step_seconds)
        assert r.stage_seconds.checkpoint == r.checkpoint_seconds
    # a resume from step 2 keeps exactly the records up to it, measured times included
    truncate_jsonl(tmp_path / "metrics.jsonl", 2)
    assert read_records(tmp_path / "metrics.jsonl") == on_disk[:2]


def test_rewrite_last_refuses_another_steps_record(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    rep.append_jsonl(log, _record(1))
    with pytest.raises(ValueError, match="step 2"):
        rep.rewrite_last_jsonl(log, _record(2, checkpoint_seconds=1.0))
    rep.rewrite_last_jsonl(log, _record(1, checkpoint_seconds=1.0))
    assert read_records(log) == [_record(1, checkpoint_seconds=1.0)]


def test_a_step_without_gradient_variance_is_skipped_by_plots_and_prometheus() -> None:
    records = [
        _record(1, gradient_variance=2.0),
        _record(2),  # trained nothing: no variance, not 0
        _record(3, gradient_variance=4.0),
    ]
    assert rep.series(records, "gradient_variance") == ([1, 3], [2.0, 4.0])
    metrics = Metrics(CollectorRegistry(), "trainer")
    rep.export(metrics, "t", _record(2, gradient_variance=5.0), StepSamples())
    rep.export(metrics, "t", _record(3), StepSamples())
    gauge = metrics["gagar_gradient_variance"].labels(run="t")
    assert gauge._value.get() == 5.0  # the step without one left the last value alone


def test_empty_step_records_no_optimization_fields() -> None:
    empty = loop._learner_stats({})
    assert empty.gradient_variance is None and empty.loss is None and empty.lr is None
    trained = loop._learner_stats({"loss": 0.5, "grad_norm": 1.0, "lr": 1e-3})
    assert trained.kl == 0.0 and trained.lr == 1e-3 and trained.gradient_variance is None
    assert rep.series([step_record(1, **empty.model_dump())], "loss") == ([], [])
