"""The GAGAR loop, the same for ``gagar train`` and the cluster trainer: ``train(ctx)`` runs the
steps, the held-out evaluation and the report over a ``Context`` that ``setup.build`` made.

Per step: draw tasks → roll out groups on vLLM in sandboxes → verify against pristine
tests → dynamic sampling, with eligible groups graded asynchronously under a deadline → GAGAR (or
GRPO) advantages → the policy update on the Megatron-Core model (mini-batches × epochs,
docs/trainer.md) → weight sync into vLLM through its RL weight-transfer API → metrics →
checkpoint. A step's record is appended to
``metrics.jsonl`` before its checkpoint, and a resume truncates the log to the checkpoint's step,
so a kill at any point loses and repeats nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from gagar.driver import advantages as adv_mod
from gagar.driver import components as comp
from gagar.driver import probe as probe_mod
from gagar.driver import report as rep
from gagar.driver import telemetry, trackers
from gagar.driver.record import (
    AdvantageStats,
    FlaggedTurns,
    GradingStats,
    LearnerStats,
    RolloutStats,
    StageSeconds,
    StepRecord,
    StepSamples,
    read_records,
)
from gagar.driver.rollouts import GroupResult, RolloutConfig, Rollouts, grading_group
from gagar.driver.sampling import (
    Collected,
    SamplingPlan,
    TaskSampler,
    collect,
    grade_with_deadline,
)
from gagar.grader import episodes, quality
from gagar.grader.episodes import EPISODES_FILE
from gagar.grader.evaluate import relabel
from gagar.grader.protocol import Grader
from gagar.machine import machine
from gagar.metrics import Metrics
from gagar.rollout.agent import AgentLimits, ChatFormat, Engine
from gagar.rollout.envs.task import Task
from gagar.sandbox.types import SessionFactory
from gagar.spec import AlgorithmSpec, GagarRun
from gagar.trainer.checkpoint import CheckpointManager
from gagar.trainer.distributed import Team, TeamStep
from gagar.trainer.learner import Learner, Sample
from gagar.wire import FallbackReason, GradingGroup, Ranking

Closers = list[Callable[[], object]]  # what to stop when the run ends, oldest first


class WeightSync(Protocol):
    """Publishes the trainer's weights as policy ``version`` and loads them into the engine."""

    def sync(self, weights: Any, version: int) -> Any: ...


@dataclass(frozen=True)
class Services:
    """What the embedded default and the cluster trainer do differently, and nothing else: a
    provider fills it (``gagar.driver.local.LocalProvider``, ``gagar.driver.worker.ClusterProvider``)."""

    sandboxes: SessionFactory
    engine: Engine
    sync: WeightSync
    grader: Grader
    fallback_grader: Grader
    engine_alive: Callable[[float], None] | None = None
    """``check_alive(wait)`` of a vLLM server this process runs: raises with its exit and log."""


@dataclass
class Context:
    """Everything a step needs; built once, by keyword, by ``gagar.driver.setup.build``."""

    run: GagarRun
    out: Path
    policy_dir: Path
    model: torch.nn.Module  # this rank's shard of the Megatron-Core policy
    learner: Learner
    ckpt: CheckpointManager
    # Runs the steps every trainer rank takes part in (update, weights, save, restore): in one
    # process it just calls them; in the cluster trainer rank 0 announces them to the others.
    team: Team
    train_tasks: list[Task]
    held_out: list[Task]
    fmt: ChatFormat
    sampler: TaskSampler
    metrics: Metrics
    services: Services
    metrics_port: int
    warm_start: dict[str, Any]
    trackers: trackers.Trackers  # spec.observability.trackers (none by default)
    # the published starting weights, whose digest keys this machine's cache of the probe's start
    # score (LocalProvider); None: no cache (the cluster trainer)
    start_weights: Path | None = None
    step: int = 0
    version: int = 0  # the policy version the engine serves
    closers: Closers = field(default_factory=list)
    # rollout.maxStaleness 1: the next step's collection, started before this step's update, and
    # the sampler's position before it drew (what a checkpoint of this step records).
    ahead: asyncio.Future[Collected] | None = None
    sampler_state: dict[str, int] | None = None
    collecting: bool = False  # a collection is in flight: weight sync must wait

    def call(self, step: TeamStep, *args: Any) -> Any:
        return self.team.call(step, *args)

    @property
    def alg(self) -> AlgorithmSpec:
        return self.run.spec.algorithm


def rollout_config(run: GagarRun) -> RolloutConfig:
    a, lim = run.spec.rollout.agent, run.spec.sandbox.limits
    limits = AgentLimits(
        a.max_turns,
        a.max_tokens_per_turn,
        a.max_context_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
    )
    return RolloutConfig(limits, command_timeout=lim.wall_seconds, verify_timeout=lim.wall_seconds)


def held_back_outcomes(group: GroupResult, passes: list[int]) -> dict[str, bool] | None:
    """Whether each pass (its member index, a JSON key) also passed its task's held-back tests
    (``Task.held_back``: the reward never ran them, the grader never saw them), the label an
    episode gives the grader's SFT; None where the task holds none back."""
    if not group.task.held_back:
        return None
    return {str(i): not group.rollouts[i].overfit for i in passes}


async def _grade(
    ctx: Context, group: GroupResult, counts: quality.QualityCounts | None = None
) -> Ranking:
    """The group's ranking (the one training uses); ``counts`` gets what it says of the grader's
    quality (``_measure``)."""
    wire = grading_group(group)
    spec = ctx.run.spec.grader

    async def fallback(g: GradingGroup, reason: str) -> Ranking:
        short: FallbackReason = "timeout" if reason == "timeout" else "grader_error"
        if spec.fallback == "heuristic":
            ranking = await ctx.services.fallback_grader.grade(g)
            return ranking.model_copy(update={"fallback": short, "detail": reason})
        return Ranking(grader="none", fallback=short, detail=reason)

    with episodes.capture() as transcripts:  # an in-process agentic grader's messages
        ranking = await grade_with_deadline(
            ctx.services.grader.grade, wire, spec.deadline_seconds, fallback
        )
    # one record per graded group: the data the grader's SFT reads (``gagar.grader.episodes``);
    # the step is the one being collected for (a collection ahead is the next step's)
    where = {
        "step": ctx.step + 1,
        "policy_version": ctx.version,
        "held_back": held_back_outcomes(group, wire.passes()),
    }
    episodes.append(ctx.out / EPISODES_FILE, episodes.record(wire, ranking, transcripts, **where))
    if counts is not None:  # after the capture: an audit's transcript is not an episode
        counts.add(await _measure(ctx, wire, ranking))
    return ranking


async def _measure(ctx: Context, wire: GradingGroup, ranking: Ranking) -> quality.QualityCounts:
    """The grader's quality on one group (``gagar.grader.quality``): an agentic ranking compared
    with the heuristic's, and, for ``spec.grader.auditFraction`` of the usable rankings (seeded
    by the run's seed, the step and the task), a second grading with the candidates relabelled.
    Neither ranking goes into training."""
    counts = quality.QualityCounts()
    if not quality.usable(ranking):
        return counts
    if ranking.grader == "agentic":
        heuristic = await ctx.services.fallback_grader.grade(wire)
        counts.add(quality.heuristic_agreement(ranking, heuristic, wire.passes()))
    key = f"{ctx.alg.seed}:{ctx.step + 1}:{wire.task_id}"
    if not quality.audited(ctx.run.spec.grader.audit_fraction, key):
        return counts
    perm = quality.audit_permutation(len(wire.candidates), key)

    async def unusable(g: GradingGroup, reason: str) -> Ranking:
        return Ranking(grader="none", fallback="grader_error", detail=reason)

    deadline = ctx.run.spec.grader.deadline_seconds
    audit = await grade_with_deadline(
        ctx.services.grader.grade, relabel(wire, perm), deadline, unusable
    )
    counts.add(quality.audit_counts(wire, ranking, audit, perm))
    return counts


def _rollouts(ctx: Context) -> Rollouts:
    engine = telemetry.metered(ctx.services.engine, ctx.metrics, ctx.run.metadata.name)
    return make_rollouts(ctx.run, ctx.services.sandboxes, engine, ctx.fmt, ctx.version)


def make_rollouts(
    run: GagarRun, sandboxes: SessionFactory, engine: Engine, fmt: ChatFormat, version: int
) -> Rollouts:
    """The rollouts of a collection on the engine serving policy ``version`` (also bench/)."""
    concurrency = run.spec.rollout.agent.concurrency
    return Rollouts.bounded(sandboxes, engine, fmt, rollout_config(run), concurrency, version)


def sampling_plan(alg: AlgorithmSpec) -> SamplingPlan:
    return SamplingPlan(
        alg.tasks_per_step,
        alg.dynamic_sampling.max_extra_rounds,
        alg.dynamic_sampling.enabled,
        grade=True,
    )


async def _collect(ctx: Context) -> Collected:
    """One step's groups, all sampled by the policy version the engine serves now (``_sync``
    refuses to run while a collection is in flight)."""
    alg = ctx.alg
    rollouts = _rollouts(ctx)

    async def rollout(task: Any, draw: int) -> GroupResult:
        return await rollouts.group(task, alg.group_size, alg.seed * 1_000_003 + draw)

    async def measure(group: GroupResult) -> Ranking:
        """GRPO's groups are ranked by the heuristic grader for the metrics only (its
        advantages ignore rankings), so both modes report the bloated share of passes."""
        return await ctx.services.fallback_grader.grade(grading_group(group))

    counts = quality.QualityCounts()  # this collection's: one ahead is the next step's
    grade = (lambda g: _grade(ctx, g, counts)) if alg.mode == "gagar" else measure
    ctx.collecting = True
    try:
        collected = await collect(ctx.sampler, sampling_plan(alg), rollout, grade)
    finally:
        ctx.collecting = False
        rollouts.close()
    collected.version, collected.quality = rollouts.version, counts
    return collected


def _samples(groups: list[GroupResult], per_token: list[list[float]]) -> list[Sample]:
    flat = [(gi, r) for gi, g in enumerate(groups) for r in g.rollouts]
    return [
        Sample(r.trajectory.token_ids, r.trajectory.loss_mask, r.trajectory.logprobs, adv, gi)
        for (gi, r), adv in zip(flat, per_token, strict=True)
        if r.valid and r.trajectory.response_tokens
    ]


@dataclass
class _GroupFacts:
    grading: GradingStats  # less the advantages' summaries and trained_groups
    lambdas: list[float]  # λ of the redistributed groups
    factors: list[float]  # quality factors of the graded passes


def _group_facts(
    groups: list[GroupResult],
    rankings: list[Ranking | None],
    batch: adv_mod.GroupBatch,
    alg: AlgorithmSpec,
) -> _GroupFacts:
    """Per-step facts about grading: fallbacks, hacks, λ, factors, bloat.

    A fallback is a group GAGAR meant to redistribute and did not; plain GRPO never means to, so
    it has none (every group would otherwise count as "unusable"). Factors and the bloated share
    come from the rankings in both modes (GRPO's are measured, not used)."""
    redistributes = alg.mode == "gagar"
    factors = adv_mod.ranking_factors([g.rollouts for g in groups], rankings, alg)
    fallbacks: dict[str, int] = {}
    for code in batch.result.fallback.tolist() if redistributes else []:
        if code:
            name = adv_mod.FALLBACK_NAMES[code]
            fallbacks[name] = fallbacks.get(name, 0) + 1
    graded_by: dict[str, int] = {}  # which grader produced each ranking ("none": unusable)
    skipped: dict[str, int] = {}  # files the graders left out or did not read whole, by reason
    for ranking in rankings:
        if ranking is None:
            continue
        graded_by[ranking.grader] = graded_by.get(ranking.grader, 0) + 1
        for s in ranking.skipped:
            skipped[s.reason] = skipped.get(s.reason, 0) + 1
        if ranking.fallback and ranking.grader != "none":
            key = f"heuristic_after_{ranking.fallback}"
            fallbacks[key] = fallbacks.get(key, 0) + 1
    redistributed = [
        float(x)
        for x, code in zip(batch.result.lam.tolist(), batch.result.fallback.tolist(), strict=True)
        if code == 0
    ]
    passes = [
        (gi, j)
        for gi, g in enumerate(groups)
        for j, r in enumerate(g.rollouts)
        if r.valid and r.passed and rankings[gi] is not None
    ]
    # the grader's tiers, not the factors: an ablation with every factor 1 still measures bloat,
    # and a second T1 group (factor 0.9) is not bloated
    below_t1 = [
        b
        for gi, j in passes
        if (rk := rankings[gi]) is not None and (b := rk.below_t1(j)) is not None
    ]
    grading = GradingStats(
        fallbacks=fallbacks,
        graded_by=graded_by,
        grader_skipped=skipped,
        hacks=int(batch.hacks.sum()),
        lambda_mean=sum(redistributed) / len(redistributed) if redistributed else 0.0,
        bloated_passes_ratio=sum(below_t1) / len(below_t1) if below_t1 else 0.0,
        # the counts behind the ratio: the summary pools them over steps (x of n), never
        # averages per-step ratios of 3 or 4 passes
        bloated_passes=sum(below_t1),
        graded_passes=len(below_t1),
        usable_groups=sum(r is not None and quality.usable(r) for r in rankings),
    )
    return _GroupFacts(grading, redistributed, [float(factors[gi, j]) for gi, j in passes])


def _rollout_facts(all_groups: list[GroupResult]) -> tuple[RolloutStats, list[int], list[int]]:
    """The step's rollout stats, and each valid trajectory's response tokens and turns."""
    rollouts = [r for g in all_groups for r in g.rollouts]
    valid = [r for r in rollouts if r.valid]
    invalid: dict[str, int] = {}
    flagged = {"redundant": 0, "tool_error": 0, "churn": 0}
    for r in rollouts:
        if not r.valid:
            reason = r.trajectory.exit_reason or "verify_error"
            invalid[reason] = invalid.get(reason, 0) + 1
        for kind, count in r.trajectory.flag_counts().items():
            flagged[kind] += count
    tokens = [r.trajectory.response_tokens for r in valid]
    turns = [r.trajectory.num_turns for r in valid]
    stats = RolloutStats(
        pass_rate=sum(r.passed for r in valid) / len(valid) if valid else 0.0,
        passes=sum(r.passed for r in valid),
        valid_trajectories=len(valid),
        invalid=invalid,
        flagged_turns=FlaggedTurns(**flagged),
        tampered=sum(r.tampered for r in valid),
        response_tokens_mean=sum(tokens) / len(tokens) if tokens else 0.0,
        turns_mean=sum(turns) / len(turns) if turns else 0.0,
        generated_tokens=sum(r.trajectory.response_tokens for r in rollouts),
        verifications=sum(g.verifications for g in all_groups),
        verdicts_shared=sum(g.verdicts_shared for g in all_groups),
    )
    return stats, tokens, turns


# Record field (``LearnerStats``) → the learner's metric. Fields of a step that trained nothing are
# None (no update, no learning rate used, no gradient), never 0; plots and Prometheus skip them.
LEARNER_FIELDS = {
    "loss": "loss", "kl": "kl", "entropy": "entropy", "lr": "lr",
    "rollout_logp_abs_diff": "rollout_logp_abs_diff", "clip_ratio": "pg_clipfrac",
    "clip_low_ratio": "pg_clipfrac_low", "clip_high_ratio": "pg_clipfrac_high",
    "clip_dual_ratio": "pg_clipfrac_dual", "ratio_mean": "ratio_mean", "ratio_max": "ratio_max",
    "tis_weight": "tis_weight", "grad_norm": "grad_norm", "gradient_variance": "gradient_variance",
    "gradient_variance_scaled": "gradient_variance_scaled",
    "gradient_mean_norm": "gradient_mean_norm", "gradient_noise_scale": "gradient_noise_scale",
    "gradient_noise_trace": "gradient_noise_trace", "gradient_signal_sq": "gradient_signal_sq",
}  # fmt: skip


def _learner_stats(metrics: dict[str, float]) -> LearnerStats:
    values: dict[str, float] = {k: metrics[m] for k, m in LEARNER_FIELDS.items() if m in metrics}
    if metrics:  # trained: no KL term (kl.coef 0) reads 0, as does entropy where not computed
        values = {"kl": 0.0, "entropy": 0.0, **values}
    return LearnerStats(
        **values,
        tokens_trained=int(metrics.get("tokens_trained", 0)),
        micro_batches=int(metrics.get("micro_batches", 0)),
        optimizer_steps=int(metrics.get("optimizer_steps", 0)),
    )


def _train(ctx: Context, collected: Collected) -> tuple[LearnerStats, GradingStats, StepSamples]:
    """Advantages and the update: the learner's and the grading's part of the record, and the
    per-trajectory values for Prometheus."""
    groups, rankings = collected.groups, collected.rankings
    if not groups:
        return _learner_stats({}), GradingStats(), StepSamples()
    rollouts = [g.rollouts for g in groups]
    batch = adv_mod.group_advantages(rollouts, rankings, ctx.alg)
    per_token = adv_mod.token_advantages(rollouts, batch.adv, ctx.alg)
    valid = torch.tensor([[r.valid for r in g] for g in rollouts])
    before, after = batch.result.adv_before[valid].tolist(), batch.adv[valid].tolist()
    facts = _group_facts(groups, rankings, batch, ctx.alg)
    samples = _samples(groups, per_token)
    # ctx.step completed steps: this is step index ctx.step, which sets the learning rate.
    metrics = ctx.call("update", samples, ctx.step) if samples else {}
    grading = facts.grading.model_copy(
        update={
            **dataclasses.asdict(collected.quality),
            "trained_groups": len(groups),
            "adv_before": AdvantageStats(**rep.summarize(before)),
            "adv_after": AdvantageStats(**rep.summarize(after)),
        }
    )
    extras = StepSamples(
        adv_before=before, adv_after=after, lambdas=facts.lambdas, factors=facts.factors
    )
    return _learner_stats(metrics), grading, extras


def _sync(ctx: Context) -> float:
    if ctx.collecting:  # would mix two policies in one trajectory
        raise RuntimeError("weight sync while a collection is in flight")
    start = time.perf_counter()
    ctx.version += 1
    ctx.services.sync.sync(ctx.call("weights"), ctx.version)
    return time.perf_counter() - start


ENGINE_EXIT_WAIT_S = 15.0  # a vLLM server whose engine core died exits within seconds


class EngineLost(RuntimeError):
    """Trajectories of an evaluation failed at the engine: its numbers would be wrong."""


def check_engine(ctx: Context, groups: list[GroupResult], *, strict: bool) -> None:
    """Fail at once, with vLLM's exit and log, when trajectories failed because the engine died,
    instead of training on or scoring what survived. A live engine's errors make trajectories
    invalid (counted per step); ``strict`` (an evaluation, which must score every task) fails on
    any."""
    lost = [
        r.trajectory.exit_detail or "engine error"
        for g in groups
        for r in g.rollouts
        if r.trajectory.exit_reason == "engine_error"
    ]
    if not lost:
        return
    if ctx.services.engine_alive is not None:
        ctx.services.engine_alive(ENGINE_EXIT_WAIT_S)
    if strict:
        total = sum(len(g.rollouts) for g in groups)
        raise EngineLost(
            f"{len(lost)} of {total} trajectories failed at the engine (first: {lost[0][:300]})"
        )


async def _step_rollouts(ctx: Context) -> tuple[Collected, float, float]:
    """This step's collection (started by the previous step when ``maxStaleness`` is 1), and how
    long the step waited for its rollouts and for their grading."""
    start = time.perf_counter()
    ahead, ctx.ahead, ctx.sampler_state = ctx.ahead, None, None
    collected = await (ahead if ahead is not None else _collect(ctx))
    waited = time.perf_counter() - start
    grading = min(collected.grading_wait_seconds, waited)
    return collected, waited - grading, grading


def _collect_ahead(ctx: Context) -> float:
    """``maxStaleness`` 1: publish the last update's weights (no collection is in flight), then
    start the next step's collection on them; it runs while this step trains."""
    sync_seconds = _sync(ctx) if ctx.version < ctx.step else 0.0
    if ctx.step + 1 < ctx.alg.total_steps:
        ctx.sampler_state = ctx.sampler.state()  # a checkpoint of this step resumes from here
        ctx.ahead = asyncio.ensure_future(_collect(ctx))
    return sync_seconds


async def rl_step(ctx: Context) -> StepRecord:
    """One training step; returns its record (also written and exported).

    ``rollout.maxStaleness`` 0: collect on the last update's weights, update, sync. 1: the
    collection of this step was started by the previous one (on the weights before its update);
    sync the previous update's weights, start the next step's collection, then update while it
    runs. Either way every trajectory is sampled by one policy version (``_sync`` refuses to run
    during a collection) and the record says how many versions it lags (``staleness_versions``)."""
    t0 = time.perf_counter()
    overlap = ctx.run.spec.rollout.max_staleness > 0
    collected, rollout_wait, grading_wait = await _step_rollouts(ctx)
    check_engine(ctx, collected.all_groups, strict=False)
    sync_seconds = _collect_ahead(ctx) if overlap else 0.0
    t1 = time.perf_counter()
    if overlap:  # off the event loop: the next step's rollouts proceed meanwhile
        learner, grading, extras = await asyncio.to_thread(_train, ctx, collected)
    else:
        learner, grading, extras = _train(ctx, collected)
    t2 = time.perf_counter()
    dump_rollouts(ctx.out / "rollouts" / f"step_{ctx.step + 1:06d}.jsonl", collected.all_groups)
    if collected.version is None:
        raise RuntimeError("a collection finished without the policy version that sampled it")
    staleness = ctx.step - collected.version  # updates between the sampling and this one
    if not overlap:
        sync_seconds = _sync(ctx)
    rollouts, extras.response_tokens, extras.turns = _rollout_facts(collected.all_groups)
    ctx.step += 1
    record = StepRecord(
        step=ctx.step,
        policy_version=ctx.version,
        rollout_policy_version=collected.version,
        staleness_versions=staleness,
        learner=learner,
        rollouts=rollouts,
        grading=grading,
        sampled_groups=collected.sampled,
        sampling_rounds=collected.rounds,
        shortfall=collected.shortfall,
        eligible_groups_ratio=sum(g.eligible for g in collected.all_groups)
        / max(1, collected.sampled),
        rollout_seconds=collected.rollout_seconds,
        grading_seconds=collected.grading_wait_seconds,
        training_seconds=t2 - t1,
        sync_seconds=sync_seconds,
        step_seconds=time.perf_counter() - t0,
        stage_seconds=StageSeconds(rollout=rollout_wait, grading_wait=grading_wait, update=t2 - t1),
        rollout_tokens_per_second=rollouts.generated_tokens / max(1e-9, collected.rollout_seconds),
        training_tokens_per_second=learner.tokens_trained / max(1e-9, t2 - t1),
    )
    telemetry.record_step(ctx.metrics, ctx.run.metadata.name, collected.all_groups, record)
    return _finish_step(ctx, record, extras)


def stage_times(record: StepRecord) -> StageSeconds:
    """The step's time by stage, adding up to ``step_seconds``: ``other`` is what the named
    stages leave (advantages, the rollout dump, metrics)."""
    named = record.stage_seconds.model_copy(
        update={
            "sync": record.sync_seconds,
            "checkpoint": record.checkpoint_seconds or 0.0,
            "other": 0.0,
        }
    )
    named.other = max(0.0, record.step_seconds - sum(named.model_dump().values()))
    return named


def dump_rollouts(path: Path, groups: list[GroupResult]) -> None:
    """The step's trajectories as readable JSONL (one line per trajectory), for inspection."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for g in groups:
            for i, r in enumerate(g.rollouts):
                turns = [
                    {
                        "assistant": t.text,
                        "observation": (t.observation.text[:1000] if t.observation else None),
                        "flags": sorted(t.flags),
                    }
                    for t in r.trajectory.turns
                ]
                line = {
                    "task": g.task.instance_id,
                    "member": i,
                    "passed": r.passed,
                    "valid": r.valid,
                    "exit": r.trajectory.exit_reason,
                    "policy_version": r.trajectory.policy_version,
                    "tampered": r.tampered,
                    "overfit": r.overfit,
                    "turns": turns,
                }
                fh.write(json.dumps(line) + "\n")


def _finish_step(ctx: Context, record: StepRecord, extras: StepSamples) -> StepRecord:
    """Append the step's record, then checkpoint (a resume truncates the log to its checkpoint,
    so a kill in between repeats nothing). A checkpoint's duration is known only after it, so a
    checkpoint step's record is appended without ``checkpoint_seconds`` and, once the save is
    complete, rewritten in place (atomically: ``rep.rewrite_last_jsonl``) with the measured
    time; a kill between the two leaves it absent (unknown), never a made-up 0."""
    spec = ctx.run.spec.trainer.checkpoint
    log = ctx.out / "metrics.jsonl"
    record.checkpoint_step = _checkpoint_step(ctx)
    if ctx.step % spec.interval_steps == 0 or ctx.step == ctx.alg.total_steps:
        record.stage_seconds = stage_times(record)
        rep.append_jsonl(log, record)
        t = time.perf_counter()
        save_checkpoint(ctx)
        record.checkpoint_seconds = time.perf_counter() - t
        record.step_seconds += record.checkpoint_seconds  # the checkpoint is part of the step
        record.stage_seconds = stage_times(record)
        record.checkpoint_step = _checkpoint_step(ctx)
        rep.rewrite_last_jsonl(log, record)
    else:
        record.checkpoint_seconds = 0.0  # no checkpoint this step
        record.stage_seconds = stage_times(record)
        rep.append_jsonl(log, record)
    rep.export(ctx.metrics, ctx.run.metadata.name, record, extras)
    ctx.trackers.log_step(record)
    return record


def _checkpoint_step(ctx: Context) -> int:
    complete = ctx.ckpt.complete()
    return complete[-1].step if complete else 0


def save_checkpoint(ctx: Context) -> None:
    state = {
        # the saved weights' version: the last update's, published or not yet (maxStaleness 1)
        "policy_version": max(ctx.version, ctx.step),
        # a collection started ahead has drawn the next step's tasks: a resume draws them again
        "sampler": ctx.sampler_state or ctx.sampler.state(),
        "python_rng": repr(random.getstate()),
    }
    ctx.call("save", ctx.step, state)  # every rank writes its model/optimizer/RNG parts


def summary_line(record: StepRecord) -> str:
    r, g = record.rollouts, record.grading
    return (
        f"pass {r.pass_rate:.2f} · adv± {g.adv_after.abs_max:.2f} · λ {g.lambda_mean:.2f} · "
        f"len {r.response_tokens_mean:.0f} · {record.step_seconds:.1f}s"
    )


def close_all(closers: Closers) -> None:
    """Stop what was started, newest first; a closer that fails does not stop the others."""
    for closer in reversed(closers):
        with contextlib.suppress(Exception):
            closer()


def close(ctx: Context) -> None:
    close_all(ctx.closers)


def write_final_report(ctx: Context, extra: dict[str, Any]) -> dict[str, Any]:
    records = read_records(ctx.out / "metrics.jsonl")
    summary = {
        "run": ctx.run.metadata.name,
        "mode": ctx.alg.mode,
        "policy_version": ctx.version,
        "warm_start": ctx.warm_start,
        "precision": comp.compute_precision(ctx.run.spec, ctx.model).as_dict(),
        "machine": machine(),
        **extra,
    }
    report = rep.write_report(ctx.out, records, summary)
    ctx.trackers.log_plots(ctx.out / name for name in report["plots"])
    (ctx.out / "run.json").write_text(json.dumps(ctx.run.to_wire(), indent=2))
    return report


async def train(
    ctx: Context,
    on_step: Callable[[StepRecord], None] = lambda record: None,
    *,
    eval_tasks: int = 0,
    eval_only: bool = False,
    probe_samples: int = 0,
) -> dict[str, Any]:
    """The run: the probe set's start score (``probe_samples`` > 0), steps up to ``totalSteps``
    (``on_step`` sees each record), the probe set's end score, then the held-out evaluation of
    ``eval_tasks`` tasks, then the report (returned, and written to ``report.json``). The
    engine client's connections are closed at the end, in the event loop they belong to."""
    try:
        return await _run(ctx, on_step, eval_tasks, eval_only, probe_samples)
    finally:
        aclose = getattr(ctx.services.engine, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):  # closing never hides the run's own error
                await aclose()


async def _run(
    ctx: Context,
    on_step: Callable[[StepRecord], None],
    eval_tasks: int,
    eval_only: bool,
    probe_samples: int,
) -> dict[str, Any]:
    probes = probe_mod.probe_tasks(ctx.train_tasks, probe_samples)
    start = probe_mod.load_start(ctx.out) if probes else None
    if probes and start is None:
        start = await _probe_start(ctx, probes)
        probe_mod.save_start(ctx.out, start)
    try:
        while ctx.step < ctx.alg.total_steps and not eval_only:
            on_step(await rl_step(ctx))
    finally:
        if ctx.ahead is not None:  # a step failed with the next one's collection in flight
            ctx.ahead.cancel()
            with contextlib.suppress(BaseException):
                await ctx.ahead
            ctx.ahead = None
    if ctx.version < ctx.step:  # maxStaleness 1 leaves the last update unpublished
        _sync(ctx)
    extra: dict[str, Any] = {}
    if probes:
        end = probe_mod.summary(await evaluate(ctx, probes, probe_mod.PROBE_SEED, "probe_end"))
        extra["probe"] = {"start": start, "end": end}
    evaluation = await evaluate(ctx, ctx.held_out[:eval_tasks]) if eval_tasks else {}
    return write_final_report(ctx, {"held_out": evaluation, **extra})


async def _probe_start(ctx: Context, probes: list[Task]) -> dict[str, Any]:
    """The probe's start score: from this machine's cache when the same weights were probed with
    the same settings before (not on a resumed run: its published weights have moved)."""
    rollouts = ctx.out / "rollouts" / "probe_start.jsonl"
    key = None
    if ctx.start_weights is not None and ctx.step == 0:
        key = probe_mod.start_key(ctx.run, ctx.start_weights, len(probes))
        cached = probe_mod.cached_start(key, rollouts)
        if cached is not None:
            return cached
    start = probe_mod.summary(await evaluate(ctx, probes, probe_mod.PROBE_SEED, "probe_start"))
    if key is not None:
        probe_mod.store_start(key, start, rollouts)
    return start


async def evaluate(
    ctx: Context, tasks: list[Any], seed: int = 0, name: str = "held_out"
) -> dict[str, Any]:
    """Resolution rate on held-out tasks (one rollout each), length, and bloat among passes;
    ``samples``: each rollout's task, outcome, length and bloat (trajectories in
    ``rollouts/<name>.jsonl``).

    Raises ``EngineLost`` (or the dead server's error) when any trajectory failed at the engine;
    a sandbox failure leaves its task out of the rates (``valid`` < ``tasks``)."""
    if not tasks:
        return {"tasks": 0}
    runner = _rollouts(ctx)
    try:
        groups = await asyncio.gather(
            *(runner.group(t, 1, 7_000_000 + seed + i) for i, t in enumerate(tasks))
        )
    finally:
        runner.close()
    dump_rollouts(ctx.out / "rollouts" / f"{name}.jsonl", list(groups))
    check_engine(ctx, list(groups), strict=True)
    rollouts = [g.rollouts[0] for g in groups]
    valid = [r for r in rollouts if r.valid]
    # a pass that breaks held-back tests (``Task.held_back``) overfit: no resolution
    passes = [
        (g, r)
        for g, r in zip(groups, rollouts, strict=True)
        if r.valid and r.passed and not r.overfit
    ]
    # by task index: a group's id() would do while the groups live, but typed it says what it
    # keys, and two tasks can never share a slot
    bloated: dict[int, bool] = {}
    for i, (g, r) in enumerate(zip(groups, rollouts, strict=True)):
        if r.valid and r.passed and not r.overfit:
            ranking = await ctx.services.fallback_grader.grade(grading_group(g))
            bloated[i] = ranking.below_t1(0) is True  # a probe "group" has one member
    samples = [
        {
            "task": g.task.instance_id,
            "valid": r.valid,
            "passed": r.valid and r.passed and not r.overfit,
            "overfit": r.overfit,
            "package": g.task.metadata.get("package"),
            "tokens": r.trajectory.response_tokens,
            "turns": r.trajectory.num_turns,
            "bloated": bloated.get(i, False),
        }
        for i, (g, r) in enumerate(zip(groups, rollouts, strict=True))
    ]
    return {
        "samples": samples,
        "tasks": len(tasks),
        "valid": len(valid),
        "resolution_rate": len(passes) / len(valid) if valid else 0.0,
        "resolution_by_package": _by_package(samples),
        "overfit_passes": sum(r.valid and r.passed and r.overfit for r in rollouts),
        "response_tokens_mean": sum(r.trajectory.response_tokens for r in valid)
        / max(1, len(valid)),
        "turns_mean": sum(r.trajectory.num_turns for r in valid) / max(1, len(valid)),
        "bloated_pass_share": sum(bloated.values()) / len(passes) if passes else 0.0,
        "tampering_passes": sum(r.tampered for _, r in passes),
    }


def _by_package(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Resolution rate per package (mined tasks' ``metadata.package``) among valid rollouts."""
    valid: dict[str, list[bool]] = {}
    for sample in samples:
        if sample["package"] is not None and sample["valid"]:
            valid.setdefault(str(sample["package"]), []).append(sample["passed"])
    return {pkg: sum(ok) / len(ok) for pkg, ok in sorted(valid.items())}
