"""The embedded default's ``Provider``: everything on this machine, in this one process.

One rank (torch.distributed on a free loopback port), the base policy prepared under the run
directory (the tiny preset's copying curriculum with a progress bar), bubblewrap sandboxes, the
policy served by a vLLM server this process starts, and the grader in process (with its own
vLLM server when the agentic grader has no endpoint).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from gagar.driver import components as comp
from gagar.driver import grader_model
from gagar.driver.loop import Closers, Services
from gagar.driver.setup import Rank, build_graders, progress_bar
from gagar.driver.sft import WARM_MARKER, cached_summary, restore_warm_start
from gagar.rollout.engines.server import free_port
from gagar.sandbox.types import SessionFactory
from gagar.spec import GagarRun
from gagar.trainer.learner import DataParallel


def init_one_process() -> None:
    """torch.distributed and Megatron's groups for a single rank (a free loopback port)."""
    from gagar.trainer.model import Parallel, init_distributed

    init_distributed(
        Parallel(1, 1, 1), rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}"
    )


@dataclass
class LocalProvider:
    out: Path
    console: Console
    metrics_address: tuple[str, int]  # ("127.0.0.1", port)
    _sandboxes: Any = None  # made (and so checked) by ``start``

    def start(self, run: GagarRun) -> Any:
        """Fail fast, before anything is written: the devices, the datasets, the sandboxes."""
        comp.check_devices(run.spec, torch.cuda.is_available())
        envs = [e.name for e in run.spec.sandbox.environments]
        comp.load_datasets(run.spec.dataset, envs)  # loaded again by the builder: checked here
        self._sandboxes = comp.sandbox_factory(run.spec.sandbox)
        init_one_process()
        return None  # a team of one needs no control group

    def data_parallel(self) -> DataParallel | None:
        return None

    caches_warm_start = True  # this machine keeps warm-started policies (gagar.driver.sft)

    @property
    def published_weights(self) -> Path:
        return serving_dir(self.out)

    def base_policy(self, run: GagarRun, group: Any) -> Path:
        """The warm-started policy from this machine's cache when it has ``run``'s (the copying
        curriculum and the SFT are then skipped), else ``comp.prepare_policy`` with a progress
        bar for the tiny preset's copying curriculum."""
        model, out = run.spec.model, self.out
        base = out / "policy" / "base"
        if (base / WARM_MARKER).exists() and cached_summary(run, base) is None:
            shutil.rmtree(base)  # another spec's (or code's) warm start: not this run's base
        if model.sft_warmup_steps and not (base / "config.json").exists():
            if restore_warm_start(run, base) is not None:
                self.console.print(f"[bold]warm start[/]: cached on this machine → {base}")
                return base
        steps = model.copy_curriculum_steps
        if model.preset != "tiny" or not steps or (out / "policy" / "base").exists():
            return comp.prepare_policy(model, out)
        self.console.print(
            f"[bold]tiny policy[/]: tokenizer, then a copying curriculum of {steps} steps"
        )
        with progress_bar("copy", self.console) as bar:
            task = bar.add_task("", total=steps)
            return comp.prepare_policy(
                model,
                out,
                lambda i, nll: bar.update(task, completed=i, description=f"nll/token {nll:.3f}"),
            )

    def sandboxes(self, run: GagarRun, closers: Closers) -> SessionFactory:
        return self._sandboxes

    def services(self, rank: Rank, sandboxes: Any, version: int, closers: Closers) -> Services:
        """The grader (its model server loads while the policy's does), then vLLM on the
        current weights."""
        run = rank.run
        grader_server = grader_model.launch(run.spec.grader, self.out)
        if grader_server is not None:
            closers.append(grader_server.stop)
        served = f"{grader_server.base_url}/v1" if grader_server is not None else None
        grader, fallback = build_graders(run, sandboxes, served)
        engine, sync, server = start_engine(run, rank.model, rank.policy_dir, self.out)
        closers.append(server.stop)
        if grader_server is not None:
            grader_model.ready(grader_server)
        return Services(
            sandboxes=sandboxes,
            engine=engine,
            sync=sync,
            grader=grader,
            fallback_grader=fallback,
            engine_alive=server.check_alive,  # to tell a dead engine from other failures
        )


def serving_dir(out: Path) -> Path:
    """Where ``start_engine`` publishes the weights vLLM serves."""
    return out / "policy" / "serving"


def start_engine(run: GagarRun, model: Any, policy_dir: Path, out: Path) -> tuple[Any, Any, Any]:
    """Publish the current weights, serve them with vLLM, and return (engine, sync, server)."""
    from gagar.engine.client import AsyncOpenAIEngine
    from gagar.rollout.engines.server import ServerConfig, VllmServer
    from gagar.rollout.engines.weight_sync import ReplicaClient, SafetensorsWeightSync
    from gagar.trainer.model import save_hf_checkpoint

    serving = serving_dir(out)
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


def build_model(policy_dir: Path) -> Any:
    """The policy in this single process (benchmarks load one without a run)."""
    from gagar.driver.setup import load_policy

    init_one_process()
    return load_policy(policy_dir)
