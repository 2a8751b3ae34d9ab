"""The loop's schedule, run for real over bubblewrap sandboxes and the synthetic tasks, with a
scripted engine and a trainer that only takes time: ``rollout.maxStaleness`` 0 keeps today's
synchronous order, 1 generates step t+1's rollouts while step t trains; every trajectory is
sampled by one policy version, which it records, and staleness never exceeds the bound. Each
step's stage times add up to its duration, in ``metrics.jsonl``, Prometheus and the report's plot."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gagar.driver import components as comp
from gagar.driver import loop
from gagar.driver.rollouts import GroupResult
from gagar.driver.sampling import TaskSampler
from gagar.driver.trackers import Trackers
from gagar.engine.base import Generation, SamplingParams
from gagar.grader.protocol import HeuristicGrader
from gagar.metrics import STAGES, Metrics
from gagar.spec import GagarRun
from tests.support.submitting import SUBMIT, Fmt

ROOT = Path(__file__).resolve().parents[2]
UPDATE_S = 0.6


@dataclass
class Engine:
    """Answers every turn with a submit after a short wait; logs (start, end, version) per request."""

    version: int = 0
    in_flight: int = 0
    log: list[tuple[float, float, int, int]] = field(default_factory=list)
    closed: int = 0

    async def aclose(self) -> None:
        self.closed += 1

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        start, version = time.perf_counter(), self.version
        self.in_flight += 1
        try:
            await asyncio.sleep(0.05)
        finally:
            self.in_flight -= 1
        self.log.append((start, time.perf_counter(), version, self.version))
        return Generation([5, 6, 7], [-0.1, -0.2, -0.3], SUBMIT, "stop", list(prompt_ids))


@dataclass
class Sync:
    engine: Engine
    versions: list[int] = field(default_factory=list)

    def sync(self, weights: Any, version: int) -> None:
        assert self.engine.in_flight == 0, "weights synced while requests were in flight"
        self.versions.append(version)
        self.engine.version = version


@dataclass
class Team:
    """The trainer's side: an update that takes ``UPDATE_S`` seconds, saves that take a little."""

    updates: list[tuple[float, float]] = field(default_factory=list)
    saves: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def call(self, step: str, *args: Any) -> Any:
        if step == "update":
            start = time.perf_counter()
            time.sleep(UPDATE_S)
            self.updates.append((start, time.perf_counter()))
            return {"loss": 0.0, "tokens_trained": sum(sum(s.loss_mask) for s in args[0])}
        if step == "weights":
            return []
        if step == "save":
            time.sleep(0.05)
            self.saves.append((args[0], args[1]))
            return None
        raise AssertionError(step)


class Checkpoints:
    def complete(self) -> list[Any]:
        return []


def _run(staleness: int) -> GagarRun:
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    spec = doc["spec"]
    spec["algorithm"].update(totalSteps=4, tasksPerStep=2, groupSize=2)
    spec["algorithm"]["dynamicSampling"] = {"enabled": False}
    spec["rollout"]["maxStaleness"] = staleness
    if staleness > 0:  # the spec refuses a lag without the truncated importance weight
        spec["algorithm"].setdefault("loss", {})["truncatedIsCap"] = 2.0
    spec["trainer"]["checkpoint"]["intervalSteps"] = 2
    spec["rollout"]["agent"]["maxTurns"] = 2
    return GagarRun.model_validate(doc)


def _context(tmp_path: Path, staleness: int) -> tuple[loop.Context, Engine, Sync, Team, Any]:
    run = _run(staleness)
    train, held = comp.load_datasets(run.spec.dataset)
    engine, team = Engine(), Team()
    sync = Sync(engine)
    registry = CollectorRegistry()
    services = loop.Services(
        sandboxes=comp.sandbox_factory(run.spec.sandbox),
        engine=engine,
        sync=sync,
        grader=HeuristicGrader(),
        fallback_grader=HeuristicGrader(),
    )
    ctx = loop.Context(
        run=run, out=tmp_path, policy_dir=tmp_path, model=None, learner=None,
        ckpt=Checkpoints(), team=team, train_tasks=train, held_out=held, fmt=Fmt(),
        sampler=TaskSampler(train, run.spec.algorithm.seed), metrics=Metrics(registry, "trainer", "rollout"),
        services=services, metrics_port=0, warm_start={}, trackers=Trackers(run, tmp_path),
    )  # fmt: skip
    return ctx, engine, sync, team, registry


def _train(tmp_path: Path, staleness: int) -> tuple[list[dict[str, Any]], Engine, Sync, Team, Any]:
    ctx, engine, sync, team, registry = _context(tmp_path, staleness)
    report = asyncio.run(loop.train(ctx))
    assert engine.closed == 1  # in the event loop its connections belong to
    assert (tmp_path / "stages.png").stat().st_size > 0 and "stages.png" in report["plots"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return records, engine, sync, team, registry


def _trajectory_versions(tmp_path: Path, step: int) -> set[int]:
    lines = (tmp_path / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()
    return {json.loads(line)["policy_version"] for line in lines}


def _overlapping(engine: Engine, team: Team) -> int:
    """Engine requests answered while an update ran."""
    return sum(1 for s, e, *_ in engine.log for us, ue in team.updates if s < ue and e > us)


def _check_stages(records: list[dict[str, Any]], registry: Any) -> None:
    for r in records:
        stages = r["stage_seconds"]
        assert list(stages) == list(STAGES)
        assert all(v >= 0 for v in stages.values())
        assert sum(stages.values()) == pytest.approx(r["step_seconds"], abs=1e-6)
        assert stages["update"] >= UPDATE_S * 0.9
    checkpointed = [r for r in records if r["step"] % 2 == 0]
    assert all(r["stage_seconds"]["checkpoint"] >= 0.05 for r in checkpointed)
    assert all(r["checkpoint_seconds"] == r["stage_seconds"]["checkpoint"] for r in records)
    for stage in STAGES:  # one observation per step and stage, their sum the steps' sum
        labels = {"run": "local", "stage": stage}
        count = registry.get_sample_value("gagar_trainer_stage_duration_seconds_count", labels)
        total = registry.get_sample_value("gagar_trainer_stage_duration_seconds_sum", labels)
        assert count == len(records)
        assert total == pytest.approx(sum(r["stage_seconds"][stage] for r in records))


def test_synchronous_loop_samples_each_step_on_the_last_update(tmp_path: Path) -> None:
    records, engine, sync, team, registry = _train(tmp_path, 0)
    assert [r["staleness_versions"] for r in records] == [0, 0, 0, 0]
    assert [r["rollout_policy_version"] for r in records] == [0, 1, 2, 3]
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4]
    assert sync.versions == [1, 2, 3, 4]
    for r in records:
        assert _trajectory_versions(tmp_path, r["step"]) == {r["rollout_policy_version"]}
    assert _overlapping(engine, team) == 0  # nothing is generated while the trainer updates
    assert all(start == end for _, _, start, end in engine.log)
    # checkpoints record the sampler where the step left it
    assert [(s, st["sampler"]["pos"], st["policy_version"]) for s, st in team.saves] == [
        (2, 4, 2),
        (4, 8, 4),
    ]
    _check_stages(records, registry)


def test_one_version_of_staleness_overlaps_rollouts_with_the_update(tmp_path: Path) -> None:
    records, engine, sync, team, registry = _train(tmp_path, 1)
    # step t+1's trajectories were sampled by the weights before step t's update
    assert [r["rollout_policy_version"] for r in records] == [0, 0, 1, 2]
    assert [r["staleness_versions"] for r in records] == [0, 1, 1, 1]
    assert max(r["staleness_versions"] for r in records) <= 1
    for r in records:
        assert _trajectory_versions(tmp_path, r["step"]) == {r["rollout_policy_version"]}
    # one version per trajectory: weights never changed under a request (``Sync`` also asserts
    # that none was in flight), and the last update is published when the run ends
    assert all(start == end for _, _, start, end in engine.log)
    assert sync.versions == [1, 2, 3, 4]
    assert _overlapping(engine, team) > 0  # the next step's rollouts ran during updates
    # a checkpoint records the sampler before the collection started ahead drew: a resume
    # rolls that step out again, on the saved weights (the last update's version)
    assert [(s, st["sampler"]["pos"], st["policy_version"]) for s, st in team.saves] == [
        (2, 4, 2),
        (4, 8, 4),
    ]
    _check_stages(records, registry)


def test_a_sync_during_a_collection_is_refused(tmp_path: Path) -> None:
    ctx, engine, *_ = _context(tmp_path, 1)

    async def race() -> None:
        collecting = asyncio.ensure_future(loop._collect(ctx))
        await asyncio.sleep(0.02)
        with pytest.raises(RuntimeError, match="weight sync while a collection is in flight"):
            loop._sync(ctx)
        await collecting

    asyncio.run(race())
    assert engine.version == 0 and ctx.version == 0


def test_spec_bounds_max_staleness() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"rollout\.maxStaleness"):
        _run(2)
    with pytest.raises(ValidationError, match=r"rollout\.maxStaleness"):
        _run(-1)


def test_a_failed_run_closes_the_engine_too(tmp_path: Path, monkeypatch: Any) -> None:
    ctx, engine, *_ = _context(tmp_path, 0)

    async def broken(ctx: Any) -> Any:
        raise RuntimeError("the step failed")

    monkeypatch.setattr(loop, "rl_step", broken)
    with pytest.raises(RuntimeError, match="the step failed"):
        asyncio.run(loop.train(ctx))
    assert engine.closed == 1


def test_grader_quality_counts_go_to_the_step_whose_groups_they_graded(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Every group audited (``spec.grader.auditFraction`` 1) with a collection ahead: each step's
    record counts the audits of its own groups, never the next step's, and /metrics their sum.
    The scripted engine never fixes a task, so every group is made gradable (eligible)."""
    monkeypatch.setattr(GroupResult, "eligible", property(lambda self: True))
    ctx, _, _, _, registry = _context(tmp_path, 1)
    doc = ctx.run.to_wire()
    doc["spec"]["grader"]["auditFraction"] = 1.0
    ctx.run = GagarRun.model_validate(doc)
    asyncio.run(loop.train(ctx))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    graded = [sum(r["graded_by"].values()) for r in records]
    assert graded == [2, 2, 2, 2]  # tasksPerStep
    assert [r["usable_groups"] for r in records] == graded  # the heuristic always ranks
    assert [r["audited_groups"] for r in records] == graded
    assert all(r["audit_consistent_pairs"] == r["audit_pairs"] for r in records)
    assert all(r["heuristic_pairs"] == 0 for r in records)  # no agentic ranking to compare
    value = registry.get_sample_value("gagar_grader_audited_groups_total", {"run": "local"})
    assert value == sum(graded)
