"""The one composition root: what ``gagar train`` and the cluster trainer build, in one order.

Both entry points call ``build_rank`` on every trainer rank (the policy shard, its learner, the
checkpoint manager, the team of ranks) and ``build`` on rank 0 (datasets, chat format, sampler,
resume or SFT warm start, the services, metrics); they differ only in the ``Provider`` that
starts the process group, finds the base policy and fills the ``Services`` (``gagar.driver.local``
for one machine, ``gagar.driver.worker`` for the cluster). Order matters for failing fast: spec
checks and data first (cheap), then the policy, then the warm start (sandboxes, no engine), then
the engine (slow to start), whose first weight publication serves a known version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from prometheus_client import CollectorRegistry, start_http_server
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gagar.driver import components as comp
from gagar.driver.loop import Closers, Context, Services, close_all, rollout_config
from gagar.driver.sampling import TaskSampler
from gagar.driver.sft import (
    cached_summary,
    expert_trajectories,
    sft,
    sft_batches,
    sft_lr,
    store_warm_start,
    warm_start_key,
)
from gagar.driver.trackers import Trackers
from gagar.grader.protocol import Grader
from gagar.metrics import Metrics
from gagar.rollout.chat import HFChatFormat
from gagar.rollout.envs import synthetic
from gagar.sandbox.types import SessionFactory
from gagar.spec import GRADER_SERVED_NAME, AgentSpec, GagarRun
from gagar.trainer.checkpoint import CheckpointError, CheckpointManager, skip, truncate_jsonl
from gagar.trainer.distributed import LayoutMismatch, RankState, Team
from gagar.trainer.learner import DataParallel, Learner, LearnerConfig, Sample
from gagar.trainer.loss import LossConfig
from gagar.trainer.policy import MegatronPolicy
from gagar.trainer.schedule import LRSchedule

log = logging.getLogger(__name__)


def quiet_megatron() -> None:
    """Megatron-Core warns at import that Transformer Engine/Apex are absent: expected here."""
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*not installed.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")


class Provider(Protocol):
    """Where the run's pieces come from: this machine (``LocalProvider``) or the cluster."""

    @property
    def out(self) -> Path:
        """The run directory (checkpoints, metrics.jsonl, the report)."""
        ...

    @property
    def console(self) -> Console: ...

    @property
    def metrics_address(self) -> tuple[str, int]:
        """Where rank 0 serves /metrics (port 0: a free one)."""
        ...

    # this machine keeps warm-started policies (gagar.driver.sft)
    caches_warm_start: bool

    @property
    def published_weights(self) -> Path | None:
        """The HF folder the engine serves, once ``services`` started, when this machine keeps
        probe start scores keyed by it (gagar.driver.probe); None: no such cache."""
        ...

    def start(self, run: GagarRun) -> Any:
        """Check the devices and start torch.distributed; returns the team's control group."""
        ...

    def data_parallel(self) -> DataParallel | None: ...

    def base_policy(self, run: GagarRun, group: Any) -> Path:
        """The base policy's HF folder, the same on every rank."""
        ...

    def sandboxes(self, run: GagarRun, closers: Closers) -> SessionFactory: ...

    def services(
        self,
        rank: Rank,
        sandboxes: SessionFactory,
        version: int,
        closers: Closers,
    ) -> Services:
        """Graders and the engine, serving policy ``version`` (the team's current weights)."""
        ...


@dataclass(frozen=True)
class Rank:
    """What every trainer rank builds: its shard of the policy, its learner, the team."""

    run: GagarRun
    out: Path
    policy_dir: Path
    model: Any
    learner: Learner
    ckpt: CheckpointManager
    team: Team


def load_policy(policy_dir: Path) -> Any:
    """This rank's shard of the policy, loaded from an HF folder (after ``init_distributed``)."""
    from gagar.trainer.model import build_model, load_hf_into_megatron, read_config

    model = build_model(read_config(policy_dir))
    load_hf_into_megatron(model, policy_dir)
    return model


def max_response_tokens(agent: AgentSpec) -> int:
    """Most tokens the policy can generate in one trajectory: ``maxTurns × maxTokensPerTurn``,
    and never more than the context. Dr. GRPO's constant normaliser (``seq-mean-token-sum-norm``)
    is this, the maximum *response* length, not the context length: the context also holds the
    prompt and the tool outputs, which carry no loss, and a larger constant only shrinks every
    gradient by the same factor (an lr change in disguise)."""
    return min(agent.max_turns * agent.max_tokens_per_turn, agent.max_context_tokens)


def build_learner(
    run: GagarRun,
    model: Any,
    parallel: DataParallel | None = None,
    reference: Any = None,
    *,
    sft: bool = False,
) -> Learner:
    """The RL learner of ``spec.algorithm`` (``reference``: the KL's frozen model, needed when
    ``kl.coef`` > 0), or with ``sft`` the warm start's: token-mean, one optimizer step per
    batch, no KL."""
    from gagar.trainer.model.parallel import current_parallel

    alg = run.spec.algorithm
    o, lo = alg.optimizer, alg.loss
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay
    )
    loss = LossConfig(
        eps_low=lo.clip_low, eps_high=lo.clip_high, dual_clip=lo.dual_clip, agg_mode="token-mean" if sft else lo.aggregation,
        max_len=max_response_tokens(run.spec.rollout.agent), tis_cap=lo.truncated_is_cap, kl_coef=0.0 if sft else lo.kl.coef, kl_estimator=lo.kl.estimator,
    )  # fmt: skip
    tp = current_parallel().tp
    schedule = LRSchedule(o.lr, o.warmup_steps, o.schedule, o.min_lr, alg.total_steps)
    cfg = LearnerConfig(
        alg.micro_batch_size, o.grad_clip, loss, comp.compute_autocast(run.spec, model),
        micro_batch_tokens=sft_micro_tokens(alg.micro_batch_tokens) if sft else alg.micro_batch_tokens,
        mini_batches=1 if sft else alg.mini_batches, epochs=1 if sft else alg.ppo_epochs,
        lr=None if sft else schedule,
    )  # fmt: skip
    ref = MegatronPolicy(reference, tensor_parallel=tp) if loss.kl_coef > 0 else None
    learner = Learner(MegatronPolicy(model, tensor_parallel=tp), optimizer, cfg, parallel, ref)
    learner.reset_reference()
    return learner


# The SFT's micro-batches: its batch's trajectories longest first, each micro-batch taking them
# while rows × longest fits this many tokens. Its loss is token-mean over the whole batch, so
# the gradient is the one batch padded to its longest would give; the expert trajectories of the
# embedded default are 405-1,149 tokens, and one padded batch of 4 computed 27 % padding
# (3,256 tokens a step for 2,570 real ones).
SFT_MICRO_TOKENS = 2048


def sft_micro_tokens(budget: int | None) -> int:
    """``algorithm.microBatchTokens`` (a memory bound the SFT keeps), at most ``SFT_MICRO_TOKENS``."""
    return SFT_MICRO_TOKENS if budget is None else min(budget, SFT_MICRO_TOKENS)


def frozen_reference(policy_dir: Path) -> Any:
    """The KL's reference: a second shard of the policy, built in the same parallel layout, in
    eval mode, without gradients (``Learner.reset_reference`` gives it the start weights)."""
    model = load_policy(policy_dir)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@dataclass
class SftStep:
    """The team step of the SFT warm start: its own token-mean learner, then one update per batch;
    on rank 0 (``console`` set) with a progress bar."""

    run: GagarRun
    model: Any
    parallel: DataParallel | None = None
    console: Console | None = None
    rl_learner: Learner | None = None

    def __call__(self, batches: list[list[Sample]]) -> list[float]:
        learner = build_learner(self.run, self.model, self.parallel, sft=True)
        for group in learner.optimizer.param_groups:
            group["lr"] = sft_lr(self.run.spec.model)
        if self.console is None:
            losses = sft(learner, batches, None)
        else:
            with progress_bar("SFT", self.console) as bar:
                task = bar.add_task("", total=len(batches))
                losses = sft(learner, batches, lambda i, nll: bar.update(
                    task, completed=i, description=f"nll/token {nll:.3f}"))  # fmt: skip
        if self.rl_learner is not None:  # the warm-started policy is the KL's reference
            self.rl_learner.reset_reference()
        return losses


def rank_team(
    run: GagarRun, model: Any, learner: Learner, ckpt: CheckpointManager, group: Any = None,
    console: Console | None = None,
) -> Team:  # fmt: skip
    """The team steps of this rank (update, weights, save, restore, sft) over ``group``."""
    import torch.distributed as dist

    from gagar.trainer.model.parallel import current_parallel

    p = current_parallel()
    rank = RankState(model, learner, ckpt, {"tp": p.tp, "ep": p.ep, "pp": p.pp}, group)
    leader = not dist.is_initialized() or dist.get_rank() == 0
    sft = SftStep(run, model, learner.parallel, console if leader else None, learner)
    return Team({**rank.handlers(), "sft": sft}, group)


def chat_format(policy_dir: Path) -> tuple[HFChatFormat, int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    # The tools are described compactly in the system prompt (rollouts.SYSTEM_PROMPT) rather than
    # as JSON schemas: a small policy's context is precious, and every turn re-reads it.
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    if not isinstance(eos, int):
        raise ValueError(f"{policy_dir}: the tokenizer's EOS token is not one token: {eos}")
    return HFChatFormat(tokenizer), eos


# One scripted expert per task (a few seconds of sandbox time apiece), each seen about twice over
# the SFT: distinct tasks teach the policy to read the problem and copy from it; repeated passes
# over a few tasks teach it to recite them (measured: 150 steps over 64 tasks recite one path).
SFT_BATCH = 4
SFT_EXPERT_TASKS = (16, 512)
FRESH_SYNTHETIC_SEED = 1_000_000  # experts beyond the training tasks come from seeds up here


def sft_tasks(run: GagarRun, tasks: list[Any]) -> list[Any]:
    """The tasks the scripted experts solve: the training tasks with a reference fix, topped up
    with fresh synthetic tasks none of the run's dataset sources (held-out split included) uses."""
    lo, hi = SFT_EXPERT_TASKS
    want = run.spec.model.sft_expert_tasks or max(
        lo, min(hi, run.spec.model.sft_warmup_steps * SFT_BATCH // 2)
    )
    chosen = [t for t in tasks if t.reference_files][:want]
    used = {
        seed
        for src in run.spec.dataset.sources
        if src.kind == "synthetic"
        for seed in comp.synthetic_seeds(src)
    }
    seed = FRESH_SYNTHETIC_SEED
    while len(chosen) < want:
        if seed not in used:
            chosen.append(synthetic.generate(seed))
        seed += 1
    return chosen


def expert_batches(
    run: GagarRun, policy_dir: Path, factory: Any, tasks: list[Any]
) -> tuple[list[list[Sample]], list[Any]]:
    """The SFT warm start's per-step batches, and the (style, trajectory, passed) they come from."""
    fmt, eos = chat_format(policy_dir)
    trajs = asyncio.run(
        expert_trajectories(
            sft_tasks(run, tasks),
            factory,
            fmt,
            eos,
            rollout_config(run),
            seed=run.spec.algorithm.seed,
            styles=run.spec.model.sft_expert_styles,
        )
    )
    batches = sft_batches(
        [t for _, t, _ in trajs],
        run.spec.model.sft_warmup_steps,
        batch_size=SFT_BATCH,
        seed=run.spec.algorithm.seed,
        whole_sequence=run.spec.model.preset == "tiny",
    )
    return batches, trajs


def warm_summary(
    run: GagarRun, trajs: list[Any], losses: list[float], policy_dir: Path | None = None
) -> dict[str, Any]:
    """What the report shows about the warm start (and the tiny preset's copying curriculum)."""
    from gagar.trainer.model.presets import COPY_SUMMARY

    styles: dict[str, list[bool]] = {}
    for style, _, passed in trajs:
        styles.setdefault(style, []).append(passed)
    copy = policy_dir / COPY_SUMMARY if policy_dir is not None else None
    extra = {"copy_curriculum": json.loads(copy.read_text())} if copy and copy.exists() else {}
    return {
        **extra,
        "sft_steps": run.spec.model.sft_warmup_steps,
        "sft_nll_first": losses[0],
        "sft_nll_last": losses[-1],
        "sft_experts": {s: f"{sum(p)}/{len(p)} pass" for s, p in styles.items()},
    }


def progress_bar(label: str, console: Console) -> Progress:
    """The bar every long phase shows: label, bar, done/total, elapsed, a live description."""
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
    )


def warm_start(
    rank: Rank, sandboxes: SessionFactory, tasks: list[Any], console: Console, cache: bool = False
) -> dict[str, Any]:
    """SFT on scripted expert trajectories (every rank updates); returns the report's summary.
    ``cache``: skip it when the base policy is already this run's warm start (restored from the
    machine's cache), else keep the result there (``gagar.driver.sft``)."""
    run = rank.run
    cached = cached_summary(run, rank.policy_dir) if cache else None
    if cached is not None:
        return cached
    key = warm_start_key(run) if cache else None  # of the code that runs, taken before it runs
    batches, trajs = expert_batches(run, rank.policy_dir, sandboxes, tasks)
    steps = run.spec.model.sft_warmup_steps
    console.print(f"[bold]SFT warm start[/]: {len(trajs)} expert trajectories, {steps} steps")
    losses = rank.team.call("sft", batches)
    summary = warm_summary(run, trajs, losses, rank.policy_dir)
    if cache:
        store_warm_start(run, rank.model, rank.policy_dir, summary, key)
    return summary


def build_graders(
    run: GagarRun, factory: SessionFactory, served: str | None = None
) -> tuple[Grader, Grader]:
    """(grader, fallback grader); ``served``: URL of the grader model server this run started."""
    from gagar.grader.protocol import HeuristicGrader

    heuristic = HeuristicGrader()
    spec = run.spec.grader
    if spec.kind == "heuristic":
        return heuristic, heuristic
    from gagar.grader.agentic import AgenticConfig, AgenticGrader
    from gagar.grader.sandbox_adapter import adapt_factory

    base_url, model = (served, GRADER_SERVED_NAME) if served else (spec.endpoint, spec.model)
    if base_url is None:
        raise comp.SetupError(
            "spec.grader.endpoint: the agentic grader needs its model's URL or spec.grader.model"
        )
    cfg = AgenticConfig(
        base_url=base_url,
        model=model or GRADER_SERVED_NAME,
        max_tokens=spec.max_tokens_per_turn,
        deadline_seconds=spec.deadline_seconds,
        max_turns=spec.max_turns,
        max_retries=spec.max_retries,
        fallback=spec.fallback,
    )
    return AgenticGrader(cfg, adapt_factory(factory)), heuristic


def announce_precision(run: GagarRun, console: Console) -> None:
    """Say which compute dtype the trainer (and the tiny preset's curriculum, where it differs)
    takes and why; warn, with the measured cost, of an explicit dtype the CPU only emulates."""
    from gagar.trainer.precision import warning

    trainer = comp.compute_precision(run.spec)
    console.print(f"[bold]compute dtype[/]: {trainer.dtype} ({trainer.reason})")
    used = [trainer]
    curriculum = comp.curriculum_precision(run.spec.model)
    if run.spec.model.copy_curriculum_steps and curriculum != trainer:
        console.print(
            f"[bold]copying curriculum dtype[/]: {curriculum.dtype} ({curriculum.reason})"
        )
        used.append(curriculum)
    for p in used:
        if (text := warning(p)) is not None:
            log.warning(text)


def build_rank(run: GagarRun, provider: Provider) -> Rank:
    """Every rank: the process group, the policy shard, its learner, checkpoints, the team."""
    group = provider.start(run)
    torch.manual_seed(run.spec.algorithm.seed)
    announce_precision(run, provider.console)
    policy_dir = provider.base_policy(run, group)
    model = load_policy(policy_dir)
    reference = frozen_reference(policy_dir) if run.spec.algorithm.loss.kl.coef > 0 else None
    learner = build_learner(run, model, provider.data_parallel(), reference)
    ckpt = CheckpointManager(provider.out / "checkpoints", keep=run.spec.trainer.checkpoint.keep)
    team = rank_team(run, model, learner, ckpt, group, provider.console)
    return Rank(run, provider.out, policy_dir, model, learner, ckpt, team)


def resume(rank: Rank, sampler: TaskSampler) -> tuple[int, int] | None:
    """Load the newest complete checkpoint that loads (every rank its parts): a checkpoint whose
    parts do not load is skipped with a warning naming it, and the previous one is tried. Returns
    (step, policy version), or None when there is none; ``metrics.jsonl`` is cut to that step."""
    tried = []
    for ckpt in rank.ckpt.candidates():  # newest first
        tried.append(ckpt.path.name)
        try:
            state = rank.team.call("restore", ckpt.step)
            sampler.load_state(state["sampler"])
            version = int(state["policy_version"])
        except LayoutMismatch:
            raise  # a different job shape, not a bad checkpoint: every older one is the same
        except (CheckpointError, RuntimeError, ValueError, KeyError, TypeError) as err:
            skip(CheckpointError(f"{ckpt.path}: {type(err).__name__}: {err}"))
            continue
        truncate_jsonl(rank.out / "metrics.jsonl", ckpt.step)
        return ckpt.step, version
    if tried:  # never start over silently on top of checkpoints that exist but do not load
        raise CheckpointError(f"no checkpoint loads ({', '.join(tried)}): see the warnings")
    return None


def build(rank: Rank, provider: Provider, *, resume_run: bool) -> Context:
    """Rank 0's context: resumed from the newest checkpoint when ``resume_run`` (else warm-started
    from scratch), its services started on the current weights, /metrics served."""
    run, console = rank.run, provider.console
    envs = [e.name for e in run.spec.sandbox.environments]
    sampler, held_out = comp.task_sampler(run.spec.dataset, run.spec.algorithm.seed, envs)
    train_tasks = sampler.tasks
    fmt, _ = chat_format(rank.policy_dir)
    closers: Closers = []
    registry = CollectorRegistry()
    metrics = Metrics(registry, "trainer", "rollout", "grader", "sandbox")
    try:
        sandboxes = provider.sandboxes(run, closers)
        resumed = resume(rank, sampler) if resume_run else None
        warm: dict[str, Any] = {}
        if resumed is not None:
            console.print(
                f"[bold]resumed[/] from the checkpoint of step {resumed[0]} (policy version {resumed[1]})"
            )
        else:
            truncate_jsonl(
                provider.out / "metrics.jsonl", 0
            )  # records of a run that left no checkpoint
            if run.spec.model.sft_warmup_steps:
                warm = warm_start(rank, sandboxes, train_tasks, console, provider.caches_warm_start)
        step, version = resumed or (0, 0)
        services = provider.services(rank, sandboxes, version, closers)
        start_weights = provider.published_weights
        addr, port = provider.metrics_address
        http, _ = start_http_server(port, addr=addr, registry=registry)
        closers.append(http.shutdown)
        tracked = Trackers(run, provider.out)  # after the services: a failed start opens no run
        closers.append(tracked.close)
    except BaseException:
        close_all(closers)
        raise
    return Context(
        run=run, out=provider.out, policy_dir=rank.policy_dir, model=rank.model,
        learner=rank.learner, ckpt=rank.ckpt, team=rank.team, train_tasks=train_tasks,
        held_out=held_out, fmt=fmt, sampler=sampler, services=services, warm_start=warm,
        metrics=metrics, start_weights=start_weights,
        metrics_port=http.server_port, trackers=tracked, step=step, version=version,
        closers=closers,
    )  # fmt: skip
