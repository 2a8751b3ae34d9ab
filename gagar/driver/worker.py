"""The cluster trainer: ``torchrun ... -m gagar.driver.worker --config-dir=/etc/gagar/config``.

Every pod of the trainer Job runs it on each of its ranks (through ``gagar.driver.launch``, which
keeps the exit codes). All ranks build their shard of the Megatron-Core policy with the spec's
TP/EP/PP and a learner whose gradients are summed over the data-parallel replicas. Rank 0 then
drives the same ``rl_step`` as ``gagar train``, against the run's remote components: the rollout
pool's vLLM servers, the grader pool, the sandbox pool (``gagar.driver.cluster`` says where they
are). Every step the other ranks take part in (a policy update on the broadcast batch, the weight
gather for publication, a checkpoint, a restore, the SFT warm start) rank 0 announces to them
first (``gagar.trainer.distributed.Team``); between those they wait.

On start rank 0 resumes from the newest complete checkpoint on the checkpoint volume (the
operator restarts the whole Job after a failure), publishes the current policy there (rollout
replicas boot from it), waits for the rollout pool, and loads the weights into every replica.
After each step it patches ``<run>-progress``. A step's metrics record and checkpoint are written
as in ``gagar train`` (``metrics.jsonl`` under ``GAGAR_RUN_DIR``).

Exit codes: 0 once ``totalSteps`` are done; ``GAGAR_EXIT_PERMANENT`` (3) when the configuration
is unusable (invalid GagarRun, a spec field this trainer cannot do, a missing dataset or model, a
checkpoint of another layout), so the operator fails the run at once; 1 for anything else, which
the operator retries with a new Job (``failurePolicy.maxRestarts``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.driver.cluster import (
    Cluster,
    ProgressReporter,
    ReplicaSync,
    give_up,
    kube_api,
    now,
    progress_data,
    resolve,
)
from gagar.driver.components import SetupError
from gagar.manifest import ConfigError
from gagar.manifest import load_config_dir as load_config
from gagar.spec import GagarRun

log = logging.getLogger("gagar.trainer")
CONTROL_TIMEOUT_S = 7 * 24 * 3600.0  # followers wait this long for rank 0's next announcement


@dataclass
class Rank:
    """What every rank holds: the run, its shard of the policy, its learner and the team."""

    run: GagarRun
    cluster: Cluster
    policy_dir: Path
    model: Any
    learner: Any
    ckpt: Any
    team: Any


def _init(run: GagarRun) -> Any:
    """torch.distributed from torchrun's environment, Megatron's groups, the control group."""
    import torch.distributed as dist

    from gagar.trainer.distributed import control_group
    from gagar.trainer.model import Parallel, init_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != run.spec.trainer.world_size:
        raise ConfigError(
            f"torchrun started {world} ranks but spec.trainer nodes × processesPerNode = "
            f"{run.spec.trainer.world_size}"
        )
    p = run.spec.trainer.parallelism
    init_distributed(Parallel(p.tensor, p.expert, p.pipeline), seed=run.spec.algorithm.seed)
    group = control_group(CONTROL_TIMEOUT_S)
    log.info("rank %d of %d up", dist.get_rank(), dist.get_world_size())
    return group


def _policy_dir(run: GagarRun, cluster: Cluster, group: Any) -> Path:
    """Rank 0 prepares the base policy (a preset is created once on the volume); all agree on it."""
    import torch.distributed as dist

    from gagar.driver.components import prepare_policy

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        box[0] = str(cluster.model_dir or prepare_policy(run.spec.model, cluster.run_dir))
    if group is not None:
        dist.broadcast_object_list(box, src=0, group=group)
    return Path(box[0])


def start(run: GagarRun, cluster: Cluster) -> Rank:
    """Everything each rank builds before training (configuration errors surface here)."""
    import torch

    from gagar.driver.setup import build_learner, load_policy, rank_team
    from gagar.trainer.checkpoint import CheckpointManager
    from gagar.trainer.distributed import megatron_data_parallel

    if run.spec.trainer.device == "cuda" and not torch.cuda.is_available():
        raise SetupError("spec.trainer.device is 'cuda' but this pod has no CUDA GPU")
    group = _init(run)
    torch.manual_seed(run.spec.algorithm.seed)
    policy_dir = _policy_dir(run, cluster, group)
    model = load_policy(policy_dir)
    learner = build_learner(run, model, parallel=megatron_data_parallel())
    ckpt = CheckpointManager(cluster.run_dir / "checkpoints", keep=run.spec.trainer.checkpoint.keep)
    team = rank_team(run, model, learner, ckpt, group)
    return Rank(run, cluster, policy_dir, model, learner, ckpt, team)


def _components(rank: Rank) -> tuple[Any, Any, Any]:
    """(sandbox factory, grader, fallback grader) of the run, remote where the cluster has pools."""
    from gagar.driver import components as comp
    from gagar.driver.setup import build_graders
    from gagar.grader.protocol import HeuristicGrader
    from gagar.grader.service import GraderClient
    from gagar.sandbox.client import HttpPoolFactory
    from gagar.sandbox.types import Limits

    run, cluster = rank.run, rank.cluster
    if cluster.sandbox_url is not None:
        limits = Limits(**run.spec.sandbox.limits.executor_limits())
        factory: Any = HttpPoolFactory(cluster.sandbox_url, limits=limits)
    else:
        factory = comp.sandbox_factory(run.spec.sandbox)
    if cluster.grader_url is not None:
        timeout = run.spec.grader.deadline_seconds + 60
        return factory, GraderClient(cluster.grader_url, timeout=timeout), HeuristicGrader()
    grader, fallback = build_graders(run, factory)
    return factory, grader, fallback


def context(rank: Rank) -> Any:
    """Rank 0's driver context: datasets, sandboxes, graders, engine, weight sync, metrics."""
    from prometheus_client import CollectorRegistry, start_http_server

    from gagar.driver import components as comp
    from gagar.driver.loop import Context
    from gagar.driver.sampling import TaskSampler
    from gagar.driver.setup import chat_format
    from gagar.metrics import Metrics
    from gagar.rollout.engines.openai_engine import AsyncOpenAIEngine

    run, cluster = rank.run, rank.cluster
    train_tasks, held_out = comp.load_datasets(run.spec.dataset)
    factory, grader, fallback = _components(rank)
    fmt, _ = chat_format(rank.policy_dir)
    registry = CollectorRegistry()
    metrics = Metrics(registry, "trainer", "rollout", "grader", "sandbox")
    api = kube_api()
    sync = ReplicaSync(cluster, api, cluster.run_dir / "published", rank.policy_dir)
    engine = AsyncOpenAIEngine(cluster.rollout_url)
    sampler = TaskSampler(train_tasks, run.spec.algorithm.seed)
    ctx = Context(
        run, cluster.run_dir, factory, train_tasks, held_out, fmt, rank.model, rank.learner,
        rank.ckpt, sampler, engine, sync, grader, fallback, metrics, rank.policy_dir,
    )  # fmt: skip
    ctx.team = rank.team
    ctx.info["api"] = api
    if hasattr(factory, "close"):
        ctx.closers.append(factory.close)
    http, _ = start_http_server(cluster.metrics_port, addr="0.0.0.0", registry=registry)
    ctx.info["metrics_port"] = http.server_port
    ctx.closers.append(http.shutdown)
    return ctx


def wait_ready(url: str, timeout_s: float, poll_s: float = 5.0) -> None:
    """Wait until the rollout server answers (any non-5xx ``/health``); TimeoutError after."""
    import httpx

    deadline, last = time.monotonic() + timeout_s, "no answer yet"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url.rstrip('/')}/health", timeout=10)
            if r.status_code < 500:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as err:
            last = repr(err)
        log.info("waiting for the rollout pool at %s (%s)", url, last)
        time.sleep(poll_s)
    raise TimeoutError(f"the rollout pool at {url} was not up within {timeout_s:.0f}s: {last}")


def _begin(ctx: Any, rank: Rank) -> None:
    """Resume or warm-start, publish the policy, wait for the rollout pool, load every replica."""
    from rich.console import Console

    from gagar.driver.loop import restore
    from gagar.driver.setup import warm_start
    from gagar.trainer.checkpoint import truncate_jsonl

    spec = rank.run.spec
    resume = spec.trainer.checkpoint.resume
    if resume and restore(ctx):
        log.info(
            "resumed from the checkpoint of step %d (policy version %d)", ctx.step, ctx.version
        )
    else:
        truncate_jsonl(
            ctx.out / "metrics.jsonl", 0
        )  # records of an attempt that left no checkpoint
        if spec.model.sft_warmup_steps:
            console = Console(stderr=True)
            ctx.info["warm_start"] = warm_start(
                rank.run, rank.team, rank.policy_dir, ctx.factory, ctx.train_tasks, console
            )
    pub = ctx.sync.publish(ctx.call("weights"), ctx.version)
    wait_ready(
        rank.cluster.rollout_url, float(os.environ.get("GAGAR_ROLLOUT_WAIT_SECONDS", "1800"))
    )
    ctx.sync.load(pub)
    log.info("policy version %d loaded into the rollout pool", ctx.version)


def _report(ctx: Any, reporter: ProgressReporter | None, start_time: str) -> None:
    if reporter is None:
        return
    done = ctx.ckpt.complete()
    checkpoint = None
    if done:
        last = done[-1]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.path.stat().st_mtime))
        uri = f"{ctx.info['checkpoint_uri']}/checkpoints/{last.path.name}"
        checkpoint = (last.step, uri, stamp)
    reporter.report(
        progress_data(ctx.step, ctx.version, ctx.sync.rollout_version, checkpoint, start_time)
    )


async def _steps(ctx: Any, reporter: ProgressReporter | None, start_time: str) -> None:
    from gagar.driver.loop import rl_step, summary_line

    total = ctx.alg.total_steps
    while ctx.step < total:
        record = await rl_step(ctx)
        log.info("step %d/%d · %s", ctx.step, total, summary_line(record))
        _report(ctx, reporter, start_time)


def lead(rank: Rank, ctx: Any) -> int:
    """Rank 0: train to ``totalSteps``, then write the report and release the other ranks."""
    from gagar.driver.loop import close, write_final_report

    start_time = now()
    ctx.info["checkpoint_uri"] = rank.cluster.checkpoint_uri
    reporter = ProgressReporter.from_cluster(rank.cluster, ctx.info["api"])
    try:
        _begin(ctx, rank)
        _report(ctx, reporter, start_time)
        asyncio.run(_steps(ctx, reporter, start_time))
        write_final_report(ctx, {"warm_start": ctx.info.get("warm_start", {})})
        log.info("done: %d steps, policy version %d", ctx.step, ctx.version)
        rank.team.stop()
        return 0
    finally:
        close(ctx)


def _logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.WARNING,  # libraries (httpx logs every request at INFO) say only what is wrong
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("gagar").setLevel(os.environ.get("GAGAR_LOG_LEVEL", "info").upper())
    # Megatron-Core warns at import that Transformer Engine/Apex are absent; expected without them.
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*not installed.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")


def _permanent_errors() -> tuple[type[BaseException], ...]:
    from gagar.trainer.distributed import LayoutMismatch
    from gagar.trainer.model import CheckpointError, UnsupportedModel

    return (ConfigError, SetupError, LayoutMismatch, UnsupportedModel, CheckpointError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gagar.driver.worker", description="the cluster trainer")
    parser.add_argument(
        "--config-dir", default=os.environ.get("GAGAR_CONFIG_DIR", "/etc/gagar/config")
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _logging()
    try:
        run = load_config(Path(args.config_dir))
        if "GAGAR_LOG_LEVEL" not in os.environ:  # the run's setting (its ConfigMap), at start
            logging.getLogger("gagar").setLevel(run.spec.observability.log_level.upper())
        cluster = resolve(os.environ, run)
    except ConfigError as err:
        return give_up(f"invalid configuration: {err}")
    try:
        rank = start(run, cluster)
        if not rank.team.leader:
            rank.team.follow()
            return 0
        return lead(rank, context(rank))
    except _permanent_errors() as err:  # at start, or a checkpoint of another layout on resume
        return give_up(str(err))
    finally:
        _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
