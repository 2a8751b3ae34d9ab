"""Assemble a ``Context`` for ``gagar train`` from a GagarRun: policy, SFT, vLLM, sandboxes, grader.

Order matters for failing fast: spec checks and data first (cheap), then the policy and the
trainer model, then the SFT warm start (sandboxes, no engine), then vLLM (slow to start), then
the first weight publication so every replica serves a known version.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry, start_http_server
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gagar.driver import components as comp
from gagar.driver import grader_model
from gagar.driver.loop import Context, restore, rollout_config
from gagar.driver.sampling import TaskSampler
from gagar.driver.sft import expert_trajectories, sft, sft_batches, sft_lr
from gagar.metrics import Metrics
from gagar.rollout.chat import HFChatFormat
from gagar.rollout.envs import synthetic
from gagar.spec import GagarRun
from gagar.trainer.checkpoint import CheckpointManager
from gagar.trainer.distributed import RankState, Team
from gagar.trainer.learner import DataParallel, Learner, LearnerConfig, Sample
from gagar.trainer.loss import LossConfig
from gagar.trainer.policy import MegatronPolicy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(policy_dir: Path) -> Any:
    """The policy in this single process (torch.distributed on a free loopback port)."""
    from gagar.trainer.model import Parallel, init_distributed

    init_distributed(
        Parallel(1, 1, 1), rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}"
    )
    return load_policy(policy_dir)


def load_policy(policy_dir: Path) -> Any:
    """This rank's shard of the policy, loaded from an HF folder (after ``init_distributed``)."""
    from gagar.trainer.model import build_model, load_hf_into_megatron, read_config

    model = build_model(read_config(policy_dir))
    load_hf_into_megatron(model, policy_dir)
    return model


def build_learner(
    run: GagarRun, model: Any, loss_mode: str | None = None, parallel: DataParallel | None = None
) -> Learner:
    from gagar.trainer.model.parallel import current_parallel

    alg = run.spec.algorithm
    o, lo = alg.optimizer, alg.loss
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay
    )
    loss = LossConfig(
        eps_low=lo.clip_low, eps_high=lo.clip_high, dual_clip=lo.dual_clip, agg_mode=loss_mode or lo.aggregation,  # type: ignore[arg-type]
        max_len=run.spec.rollout.agent.max_context_tokens, tis_cap=lo.truncated_is_cap, kl_coef=lo.kl.coef, kl_estimator=lo.kl.estimator,
    )  # fmt: skip
    policy = MegatronPolicy(model, tensor_parallel=current_parallel().tp)
    return Learner(
        policy,
        optimizer,
        LearnerConfig(
            alg.micro_batch_size, o.grad_clip, loss, comp.compute_autocast(run.spec, model)
        ),
        parallel,
    )


@dataclass
class SftStep:
    """The team step of the SFT warm start: its own token-mean learner, then one update per batch.

    ``on_step(i, nll)`` (rank 0's progress display) is set by the caller, never sent to other ranks.
    """

    run: GagarRun
    model: Any
    parallel: DataParallel | None = None
    on_step: Callable[[int, float], None] | None = None

    def __call__(self, batches: list[list[Sample]]) -> list[float]:
        learner = build_learner(self.run, self.model, "token-mean", self.parallel)
        for group in learner.optimizer.param_groups:
            group["lr"] = sft_lr(self.run.spec.model)
        return sft(learner, batches, self.on_step)


def rank_team(
    run: GagarRun, model: Any, learner: Learner, ckpt: CheckpointManager, group: Any = None
) -> Team:
    """The team steps of this rank (update, weights, save, restore, sft) over ``group``."""
    from gagar.trainer.model.parallel import current_parallel

    p = current_parallel()
    rank = RankState(model, learner, ckpt, {"tp": p.tp, "ep": p.ep, "pp": p.pp}, group)
    return Team({**rank.handlers(), "sft": SftStep(run, model, learner.parallel)}, group)


def chat_format(policy_dir: Path) -> tuple[HFChatFormat, int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    # The tools are described compactly in the system prompt (rollouts.SYSTEM_PROMPT) rather than
    # as JSON schemas: a small policy's context is precious, and every turn re-reads it.
    return HFChatFormat(tokenizer), int(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))


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
    run: GagarRun,
    team: Team,
    policy_dir: Path,
    factory: Any,
    tasks: list[Any],
    console: Console,
) -> dict[str, Any]:
    """SFT on scripted expert trajectories (every rank updates); returns the report's summary."""
    steps = run.spec.model.sft_warmup_steps
    batches, trajs = expert_batches(run, policy_dir, factory, tasks)
    console.print(f"[bold]SFT warm start[/]: {len(trajs)} expert trajectories, {steps} steps")
    with progress_bar("SFT", console) as bar:
        task = bar.add_task("", total=steps)
        team.handlers["sft"].on_step = lambda i, nll: bar.update(
            task, completed=i, description=f"nll/token {nll:.3f}"
        )
        losses = team.call("sft", batches)
    return warm_summary(run, trajs, losses, policy_dir)


def base_policy(spec: Any, out: Path, console: Console) -> Path:
    """``comp.prepare_policy`` with a progress bar for the tiny preset's copying curriculum."""
    steps = spec.model.copy_curriculum_steps
    if spec.model.preset != "tiny" or not steps or (out / "policy" / "base").exists():
        return comp.prepare_policy(spec.model, out)
    console.print(f"[bold]tiny policy[/]: tokenizer, then a copying curriculum of {steps} steps")
    with progress_bar("copy", console) as bar:
        task = bar.add_task("", total=steps)
        return comp.prepare_policy(
            spec.model,
            out,
            lambda i, nll: bar.update(task, completed=i, description=f"nll/token {nll:.3f}"),
        )


def start_engine(
    run: GagarRun, model: Any, policy_dir: Path, out: Path, version: int
) -> tuple[Any, Any, Any]:
    """Publish the current weights, serve them with vLLM, and return (engine, sync, server)."""
    from gagar.rollout.engines.openai_engine import AsyncOpenAIEngine
    from gagar.rollout.engines.server import ServerConfig, VllmServer
    from gagar.rollout.engines.weight_sync import ReplicaClient, SafetensorsWeightSync
    from gagar.trainer.model import save_hf_checkpoint

    serving = out / "policy" / "serving"
    save_hf_checkpoint(model, serving, side_files_from=policy_dir)
    cfg = ServerConfig(
        model=serving,
        max_model_len=run.spec.rollout.agent.max_context_tokens,
        # Eager: `bench/engine.py --model <SmolLM2>` measured torch.compile at 69 tokens/s for 8
        # sequences against 71 eager (122 vs 96 at 32), for a 140 s start instead of 42 s.
        enforce_eager=True,
        # One thread although the trainer waits while the policy generates: with 2 on the 2-core
        # machine an isolated prefill ran 1.9x faster, but in the loop (SmolLM2, 8 trajectories
        # and their sandboxes) step 1's rollouts took 65 s instead of 62 s and its update 61 s
        # instead of 52 s (vLLM's idle OpenMP threads compete with the trainer's).
        threads=1,
        executor_backend="uni",
    )
    server = VllmServer(cfg, out / "logs" / "vllm.log").start()
    sync = SafetensorsWeightSync(
        [ReplicaClient(server.base_url)], out / "policy" / "versions", serving
    )
    sync.init()
    return AsyncOpenAIEngine(server.base_url), sync, server


def build_graders(run: GagarRun, factory: Any, served: str | None = None) -> tuple[Any, Any]:
    """(grader, fallback grader); ``served``: URL of the grader model server this run started."""
    from gagar.grader.protocol import HeuristicGrader

    heuristic = HeuristicGrader()
    spec = run.spec.grader
    if spec.kind == "heuristic":
        return heuristic, heuristic
    from gagar.grader.agentic import AgenticConfig, AgenticGrader
    from gagar.grader.sandbox_adapter import adapt_factory

    base_url, model = (served, grader_model.SERVED_NAME) if served else (spec.endpoint, spec.model)
    if base_url is None:
        raise comp.SetupError(
            "spec.grader.endpoint: the agentic grader needs its model's URL or spec.grader.model"
        )
    cfg = AgenticConfig(
        base_url=base_url,
        model=model or "grader",
        max_tokens=spec.max_tokens_per_turn,
        deadline_seconds=spec.deadline_seconds,
        max_turns=spec.max_turns,
        max_retries=spec.max_retries,
        fallback=spec.fallback,
    )
    return AgenticGrader(cfg, adapt_factory(factory)), heuristic


def build(
    run: GagarRun, out: Path, console: Console, resume: bool, metrics_port: int | None = None
) -> Context:
    spec = run.spec
    comp.check_devices(spec, torch.cuda.is_available())
    torch.manual_seed(spec.algorithm.seed)
    train_tasks, held_out = comp.load_datasets(spec.dataset)
    factory = comp.sandbox_factory(spec.sandbox)
    policy_dir = base_policy(spec, out, console)
    model = build_model(policy_dir)
    ckpt = CheckpointManager(out / "checkpoints", keep=spec.trainer.checkpoint.keep)
    learner = build_learner(run, model)
    team = rank_team(run, model, learner, ckpt)
    warm: dict[str, Any] = {}
    if ckpt.latest() is None or not resume:
        if spec.model.sft_warmup_steps:
            warm = warm_start(run, team, policy_dir, factory, train_tasks, console)
    sampler = TaskSampler(train_tasks, spec.algorithm.seed)
    registry = CollectorRegistry()
    metrics = Metrics(registry, "trainer", "rollout", "grader", "sandbox")
    grader_server = grader_model.launch(spec.grader, out)  # loads while the policy's server does
    grader, fallback = build_graders(run, factory, grader_server and f"{grader_server.base_url}/v1")
    fmt, _ = chat_format(policy_dir)
    ctx = Context(
        run,
        out,
        factory,
        train_tasks,
        held_out,
        fmt,
        model,
        learner,
        ckpt,
        sampler,
        None,
        None,
        grader,
        fallback,
        metrics,
        policy_dir,
    )  # type: ignore[arg-type]
    ctx.team = team
    ctx.info["warm_start"] = warm
    if grader_server is not None:
        ctx.closers.append(grader_server.stop)
    if resume and restore(ctx):
        console.print(
            f"[bold]resumed[/] from the checkpoint of step {ctx.step} (policy version {ctx.version})"
        )
    ctx.engine, ctx.sync, server = start_engine(run, model, policy_dir, out, ctx.version)
    ctx.closers.append(server.stop)
    ctx.info["engine_server"] = server  # to tell a dead engine from other failures
    if grader_server is not None:
        grader_model.ready(grader_server)
    port = spec.observability.metrics_port if metrics_port is None else metrics_port
    server_http, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    ctx.info["metrics_port"] = server_http.server_port
    ctx.closers.append(server_http.shutdown)
    return ctx
