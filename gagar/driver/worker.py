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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from gagar import env as names
from gagar.driver.cluster import (
    IMAGE_POOL_WAIT_S,
    Cluster,
    ProgressReporter,
    ReplicaSync,
    give_up,
    images_data,
    kube_api,
    progress_data,
    resolve,
    serve_weights,
)
from gagar.driver.components import SetupError
from gagar.manifest import ConfigError
from gagar.manifest import load_config_dir as load_config
from gagar.spec import GagarRun, rfc3339

if TYPE_CHECKING:
    from gagar.driver.loop import Closers, Context, Services
    from gagar.driver.setup import Rank
    from gagar.sandbox.routing import RecentImages

log = logging.getLogger("gagar.trainer")
CONTROL_TIMEOUT_S = 7 * 24 * 3600.0  # followers wait this long for rank 0's next announcement


def layout(run: GagarRun) -> Any:
    """The Megatron layout of ``spec.trainer.parallelism`` (``ValueError`` if it does not fit the
    world size ``nodes × processesPerNode``)."""
    from gagar.trainer.model import Parallel

    p = run.spec.trainer.parallelism
    parallel = Parallel(p.tensor, p.expert, 1)  # no pipeline parallelism in the spec
    parallel.check(run.spec.trainer.world_size)
    return parallel


def _init(run: GagarRun) -> Any:
    """torch.distributed from torchrun's environment, Megatron's groups, the control group."""
    import torch.distributed as dist

    from gagar.trainer.distributed import control_group
    from gagar.trainer.model import init_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != run.spec.trainer.world_size:
        raise ConfigError(
            f"torchrun started {world} ranks but spec.trainer nodes × processesPerNode = "
            f"{run.spec.trainer.world_size}"
        )
    init_distributed(layout(run), seed=run.spec.algorithm.seed)
    group = control_group(CONTROL_TIMEOUT_S)
    log.info("rank %d of %d up", dist.get_rank(), dist.get_world_size())
    return group


@dataclass
class ClusterProvider:
    """The cluster trainer's ``Provider``: torchrun's ranks, the run's pools (rollout, grader,
    sandboxes) where ``cluster`` names them, weights published on the checkpoint volume."""

    cluster: Cluster
    api: Any = None  # the Kubernetes API client (None outside a cluster)
    console: Console = field(default_factory=lambda: Console(stderr=True))
    sync: ReplicaSync | None = None  # set by ``services``: the progress report reads its version
    images: RecentImages | None = None  # set by ``sandboxes`` on sandbox pods: the task images
    caches_warm_start = False  # a pod's disk is not the next run's: it always warm-starts

    @property
    def out(self) -> Path:
        return self.cluster.run_dir

    @property
    def published_weights(self) -> None:
        return None

    @property
    def metrics_address(self) -> tuple[str, int]:
        return ("0.0.0.0", self.cluster.metrics_port)

    def start(self, run: GagarRun) -> Any:
        import torch

        if run.spec.trainer.device == "cuda" and not torch.cuda.is_available():
            raise SetupError("spec.trainer.device is 'cuda' but this pod has no CUDA GPU")
        if run.spec.trainer.device == "cpu" and torch.cuda.is_available():
            raise SetupError(
                "spec.trainer.device is 'cpu' but this pod has a CUDA GPU, which the trainer uses "
                "wherever one is visible: use 'auto' or 'cuda'"
            )
        return _init(run)

    def data_parallel(self) -> Any:
        from gagar.trainer.distributed import megatron_data_parallel

        return megatron_data_parallel()

    def base_policy(self, run: GagarRun, group: Any) -> Path:
        """Rank 0 prepares it (a preset is created once on the volume); all agree on it."""
        import torch.distributed as dist

        from gagar.driver.components import prepare_policy

        box: list[Any] = [None]
        if dist.get_rank() == 0:
            box[0] = str(self.cluster.model_dir or prepare_policy(run.spec.model, self.out))
        if group is not None:
            dist.broadcast_object_list(box, src=0, group=group)
        return Path(box[0])

    def sandboxes(self, run: GagarRun, closers: Closers) -> Any:
        from gagar.driver import components as comp
        from gagar.sandbox.routing import ImageWait, RoutingFactory, pool_factory
        from gagar.sandbox.types import Limits

        limits = Limits(**run.spec.sandbox.limits.executor_limits())
        if self.cluster.sandbox_warmpool is not None:  # isolation agent-sandbox
            from gagar.sandbox.agent import AgentSandboxFactory

            claims = AgentSandboxFactory(
                self.cluster.sandbox_warmpool,
                self.cluster.namespace or "default",
                api_client=self.api,  # the pod's service account (None: agent-sandbox's loading)
                run=run.metadata.name,
                limits=limits,
            )
            closers.append(claims.close)
            return claims
        if self.cluster.sandbox_url is None:
            return comp.sandbox_factory(run.spec.sandbox)
        # the default pool, each task environment's (a session of E goes to E's pool) and each
        # task image's, made on demand: the sandbox-pools.json that lists them is read again
        factory = pool_factory(
            self.cluster.sandbox_url,
            self.cluster.sandbox_pools,
            limits,
            config_dir=self.cluster.config_dir,
            wait=ImageWait(IMAGE_POOL_WAIT_S),
        )
        if isinstance(factory, RoutingFactory):
            self.images = factory.images  # published with the progress (``publish_images``)
        closers.append(factory.close)
        return factory

    def services(self, rank: Rank, sandboxes: Any, version: int, closers: Closers) -> Services:
        """The graders (the grader pool's, else in the trainer), then the current policy
        published, the rollout pool waited for, and every replica loaded."""
        from gagar import auth
        from gagar.driver.setup import build_graders
        from gagar.engine.client import AsyncOpenAIEngine
        from gagar.grader.protocol import HeuristicGrader
        from gagar.grader.service import GraderClient

        run, cluster = rank.run, self.cluster
        if cluster.grader_url is not None:
            timeout = run.spec.grader.deadline_seconds + 60
            grader: Any = GraderClient(cluster.grader_url, timeout=timeout)
            fallback: Any = HeuristicGrader()
        else:
            grader, fallback = build_graders(run, sandboxes)
        self.sync = ReplicaSync(cluster, self.api, self.out / "published", rank.policy_dir)
        if (server := serve_weights(cluster, self.sync.root)) is not None:
            closers.append(server.close)  # new replicas boot from it, every replica updates
        pub = self.sync.publish(rank.team.call("weights"), version)
        wait_ready(cluster.rollout_url, float(os.environ.get(names.ROLLOUT_WAIT_SECONDS, "1800")))
        self.sync.load(pub)
        log.info("policy version %d loaded into the rollout pool", version)
        from gagar.driver.loop import Services

        return Services(
            sandboxes=sandboxes,
            # the run's token: the rollout pool's vLLM runs with it as its API key
            engine=AsyncOpenAIEngine(cluster.rollout_url, api_key=auth.token()),
            sync=self.sync,
            grader=grader,
            fallback_grader=fallback,
        )


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


def _progress(ctx: Context, provider: ClusterProvider, start_time: str) -> dict[str, str]:
    """The ``<run>-progress`` data after the current step."""
    done = ctx.ckpt.complete()
    checkpoint = None
    if done:
        last = done[-1]
        stamp = rfc3339(last.path.stat().st_mtime)
        uri = f"{provider.cluster.checkpoint_uri}/checkpoints/{last.path.name}"
        checkpoint = (last.step, uri, stamp)
    rollout_version = provider.sync.rollout_version if provider.sync is not None else None
    images = provider.images.wanted() if provider.images is not None else None
    return progress_data(ctx.step, ctx.version, rollout_version, checkpoint, start_time, images)


def missed_images(images: RecentImages | None) -> str | None:
    """The step's line on task images whose sessions found no ready pool in time (None: none);
    each such trajectory is invalid, counted under ``invalid.sandbox_error``."""
    missed = images.take_missed() if images is not None else {}
    if not missed:
        return None
    listed = ", ".join(f"{image} ({n})" for image, n in sorted(missed.items()))
    return (
        f"{sum(missed.values())} session(s) found no ready executor pool of their task image "
        f"within {IMAGE_POOL_WAIT_S:.0f}s (invalid.sandbox_error; status.pools and the run's "
        f"TaskImagesRefused Events say why): {listed}"
    )


def publish_images(provider: ClusterProvider, reporter: ProgressReporter | None) -> None:
    """A task image asked for the first time is published at once, not at the step's end: its
    session waits for the pool the operator makes of it (``IMAGE_POOL_WAIT_S``)."""
    if provider.images is None or reporter is None:
        return
    provider.images.on_new = lambda wanted: reporter.report(images_data(wanted))


def lead(rank: Rank, provider: ClusterProvider) -> int:
    """Rank 0: build the run, train to ``totalSteps``, write the report, release the others."""
    from gagar.driver.loop import close, summary_line, train
    from gagar.driver.record import StepRecord
    from gagar.driver.setup import build

    start_time = rfc3339(time.time())
    reporter = ProgressReporter.from_cluster(provider.cluster, provider.api)
    ctx = build(rank, provider, resume_run=rank.run.spec.trainer.checkpoint.resume)
    publish_images(provider, reporter)
    report = (
        (lambda: reporter.report(_progress(ctx, provider, start_time)))
        if reporter
        else (lambda: None)
    )

    def on_step(record: StepRecord) -> None:
        log.info("step %d/%d · %s", ctx.step, ctx.alg.total_steps, summary_line(record))
        if line := missed_images(provider.images):
            log.warning("step %d: %s", ctx.step, line)
        report()

    try:
        report()
        asyncio.run(train(ctx, on_step))
        log.info("done: %d steps, policy version %d", ctx.step, ctx.version)
        rank.team.stop()
        return 0
    finally:
        close(ctx)


def _logging() -> None:
    from gagar.driver.setup import quiet_megatron

    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.WARNING,  # libraries (httpx logs every request at INFO) say only what is wrong
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("gagar").setLevel(os.environ.get(names.LOG_LEVEL, "info").upper())
    quiet_megatron()


def _permanent_errors() -> tuple[type[BaseException], ...]:
    from gagar.trainer.distributed import LayoutMismatch
    from gagar.trainer.model import CheckpointError, UnsupportedModel

    return (ConfigError, SetupError, LayoutMismatch, UnsupportedModel, CheckpointError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gagar.driver.worker", description="the cluster trainer")
    parser.add_argument(
        "--config-dir", default=os.environ.get(names.CONFIG_DIR, "/etc/gagar/config")
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _logging()
    try:
        run = load_config(Path(args.config_dir))
        if names.LOG_LEVEL not in os.environ:  # the run's setting (its ConfigMap), at start
            logging.getLogger("gagar").setLevel(run.spec.observability.log_level.upper())
        cluster = resolve(os.environ, run, Path(args.config_dir))
    except ConfigError as err:
        return give_up(f"invalid configuration: {err}")
    from gagar.driver.setup import build_rank

    try:
        provider = ClusterProvider(cluster, kube_api())
        rank = build_rank(run, provider)
        if not rank.team.leader:
            rank.team.follow()
            return 0
        return lead(rank, provider)
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
