"""The cluster trainer for real: two torchrun ranks (gloo, CPU) against in-test services.

The trainer pod's own command (``python -m gagar.driver.launch``, i.e. torchrun's launcher)
starts ``gagar.driver.worker`` on two ranks with data parallelism 2, reading the run from a
config directory exactly as the operator's ConfigMap lays it out and the endpoints from the
environment the trainer builder sets. The services are real servers on loopback: the sandbox
executor (``gagar sandbox serve``'s server, bubblewrap), the grader service with the heuristic
grader, and a scripted rollout policy on the fake vLLM server: it answers ``/v1/completions``
with the scripted experts' turns in the tiny policy's own tokens (even members fix the bug, odd
members make a wrong fix), so every group has a pass and a fail and the step really trains, and
it implements vLLM's weight-transfer routes over the published safetensors.

One step must leave a metrics record, a complete checkpoint with one part per rank whose weights
are identical on both ranks (each rank trained on its own half of the micro-batches, so this
holds only if gradients are summed across them) and differ from the initial policy, and the new
policy version loaded into the rollout server; a second launch (a restarted Job) resumes from
that checkpoint and trains step 2. A run whose dataset file does not exist must exit with the
permanent exit code through torchrun.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from prometheus_client import generate_latest

from gagar.driver.sft import expert_turns
from gagar.grader.protocol import HeuristicGrader
from gagar.grader.service import GraderService
from gagar.operator.builders.config import config_data
from gagar.rollout.envs import synthetic
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.server import make_server
from gagar.sandbox.types import Limits
from gagar.spec import GagarRun
from tests.support.exposition import value
from tests.support.fake_vllm import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
TASKS, GROUP = 16, 2


def spec(steps: int = 1, **dataset: Any) -> GagarRun:
    source = dataset or {"kind": "synthetic", "size": TASKS, "seed": 0}
    return GagarRun.model_validate({
        "apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun",
        "metadata": {"name": "cluster-test", "namespace": "gagar"},
        "spec": {
            "model": {"preset": "tiny", "dtype": "float32"},
            "algorithm": {"mode": "gagar", "groupSize": GROUP, "tasksPerStep": 2, "totalSteps": steps,
                          "microBatchSize": 1, "seed": 0, "dynamicSampling": {"maxExtraRounds": 0},
                          "optimizer": {"lr": 1.0e-3}},
            "trainer": {"nodes": 1, "processesPerNode": 2, "device": "cpu",
                        "checkpoint": {"intervalSteps": 1, "keep": 2}},
            "rollout": {"replicas": 1, "device": "cpu",
                        "agent": {"maxTurns": 6, "maxTokensPerTurn": 512, "maxContextTokens": 3072,
                                  "concurrency": 4}},
            "grader": {"kind": "heuristic", "replicas": 1, "deadlineSeconds": 60},
            "sandbox": {"backend": "pods", "limits": {"cpuSeconds": 10, "wallSeconds": 20,
                                                     "memoryBytes": 1073741824}},
            "dataset": {"sources": [source], "heldOutFraction": 0},
        },
    })  # fmt: skip


class ScriptedPolicy:
    """``/v1/completions`` as the scripted experts would answer, in the policy's own tokens."""

    def __init__(self, policy_dir: Path) -> None:
        self.policy_dir = policy_dir
        self.tasks = synthetic.generate_many(TASKS, seed=0)
        self._tok: Any = None
        self.served: list[tuple[str, int]] = []

    def tokenizer(self) -> Any:
        if self._tok is None:  # the worker creates the preset policy before the first rollout
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.policy_dir)
        return self._tok

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        tok = self.tokenizer()
        prompt = tok.decode(body["prompt"], skip_special_tokens=False)
        turn = prompt.count("<|im_start|>assistant") - 1
        (task,) = [t for t in self.tasks if t.problem_statement.splitlines()[0] in prompt]
        member = (int(body["seed"]) - turn) % 1000  # the agent's seed: member seed + turn
        style = "clean" if member % 2 == 0 else "wrong"
        turns = expert_turns(task, style)
        text = turns[min(turn, len(turns) - 1)]
        ids = [*tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
        finish = "stop" if len(ids) <= body["max_tokens"] else "length"
        ids = ids[: body["max_tokens"]]
        self.served.append((style, turn))
        choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish,
                  "logprobs": {"token_logprobs": [-0.5] * len(ids)}}  # fmt: skip
        return {"object": "text_completion", "choices": [choice]}


class GraderThread:
    """The grader service (heuristic grader) on its own event loop in a thread."""

    def __init__(self) -> None:
        self.service = GraderService(HeuristicGrader())
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> str:
        self.runner = web.AppRunner(self.service.app())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    check_isolation()
    run_dir = tmp_path_factory.mktemp("run")
    sandbox = make_server(LocalFactory(limits=Limits(wall_time_s=20)), "127.0.0.1", 0)
    threading.Thread(target=sandbox.serve_forever, daemon=True).start()
    policy = ScriptedPolicy(run_dir / "policy" / "base")
    grader = GraderThread()
    with FakeOpenAIServer(completions=policy) as rollout:
        yield {"run_dir": run_dir, "rollout": rollout, "policy": policy, "grader": grader,
               "sandbox": f"http://127.0.0.1:{sandbox.server_address[1]}", "server": sandbox}  # fmt: skip
    grader.stop()
    sandbox.shutdown()
    sandbox.registry.close_all()
    sandbox.server_close()


def launch(run: GagarRun, tmp: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """The trainer pod's command on two local ranks; returns (exit code, output)."""
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    for key, text in config_data(run).items():  # what the operator's ConfigMap holds
        (config / key).write_text(text)
    cmd = [sys.executable, "-m", "gagar.driver.launch", "--nproc-per-node=2", "--standalone",
           "-m", "gagar.driver.worker", f"--config-dir={config}"]  # fmt: skip
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run(
        cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_two_ranks_train_one_step_against_the_run_services(services, tmp_path) -> None:
    run_dir, rollout = services["run_dir"], services["rollout"]
    env = {
        "GAGAR_RUN_DIR": str(run_dir),
        "GAGAR_CHECKPOINT_URI": "pvc://cluster-test-checkpoints",
        "GAGAR_ROLLOUT_URL": rollout.base_url,
        "GAGAR_GRADER_URL": services["grader"].url,
        "GAGAR_SANDBOX_URL": services["sandbox"],
        "GAGAR_WEIGHT_TRANSPORT": "gagar-cpu",
        "GAGAR_PROGRESS_CONFIGMAP": "cluster-test-progress",
        "GAGAR_METRICS_PORT": "0",
    }
    code, out = launch(spec(), tmp_path, env, timeout=240)
    assert code == 0, out[-6000:]
    assert "progress is not reported" in out  # no in-cluster API here: said, then skipped

    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["policy_version"] == 1
    assert record["trained_groups"] == 2 and record["pass_rate"] == 0.5
    assert record["tokens_trained"] > 0 and record["grad_norm"] > 0
    assert record["micro_batches"] == 2 * GROUP  # both ranks' micro-batches, counted once
    assert record["fallbacks"] == {}  # the grader service ranked both groups
    assert {style for style, _ in services["policy"].served} == {"clean", "wrong"}
    graded = generate_latest(services["grader"].service.registry).decode()
    assert value(graded, "gagar_grader_requests_total", grader="heuristic", outcome="ok") == 2

    step = run_dir / "checkpoints" / "step_00000001"
    assert (step / "COMPLETE").exists()
    state = json.loads((step / "state.json").read_text())
    assert state["layout"] == {"world_size": 2, "tp": 1, "ep": 1, "pp": 1}
    assert state["format"] == "megatron-dist"  # layout-independent: one copy of each tensor
    assert {"rng-rank00000.pt", "rng-rank00001.pt", "common.pt"} <= {p.name for p in step.iterdir()}
    from gagar.trainer.sharded import read_tensors

    saved = read_tensors(step)
    moments = [k for k in saved if k.startswith("optimizer.state.exp_avg_sq.")]
    assert moments and all(bool(saved[k].gt(0).any()) for k in moments)  # after the update

    from safetensors.torch import load_file

    published = run_dir / "published"
    before, after = (load_file(published / f"v{v}" / "model.safetensors") for v in (0, 1))
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) > len(before) // 2, "the update left most weights unchanged"
    assert rollout.state.version == "1"  # the rollout server loaded the new policy version
    assert set(rollout.state.loaded) == set(after)

    # The operator restarts a trainer as a whole new Job: it resumes from the checkpoint.
    code, out = launch(spec(steps=2), tmp_path, env, timeout=240)
    assert code == 0, out[-6000:]
    assert "resumed from the checkpoint of step 1 (policy version 1)" in out
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2] and rollout.state.version == "2"
    assert (run_dir / "checkpoints" / "step_00000002" / "COMPLETE").exists()


def test_a_configuration_error_inside_the_ranks_exits_permanently(services, tmp_path) -> None:
    missing = tmp_path / "no-such-tasks.jsonl"
    env = {
        "GAGAR_RUN_DIR": str(tmp_path / "run"),
        "GAGAR_ROLLOUT_URL": services["rollout"].base_url,
        "GAGAR_SANDBOX_URL": services["sandbox"],
        "GAGAR_METRICS_PORT": "0",
        "GAGAR_EXIT_PERMANENT": "3",
    }
    code, out = launch(spec(kind="jsonl", path=str(missing)), tmp_path, env, timeout=180)
    assert code == 3, out[-4000:]  # torchrun alone would exit 1
    assert f"spec.dataset.sources[0].path '{missing}' does not exist" in out
