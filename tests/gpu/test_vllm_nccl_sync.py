"""NCCL weight sync through vLLM's own ``nccl`` backend, on a CUDA machine (marked gpu).

The same control path as the CPU test in tests/integration/test_vllm_engine.py, with vLLM's
trainer engine (``NCCLTrainerWeightTransferEngine`` over a ``ModuleSource``) broadcasting from
a ``transformers`` model on the GPU to a vLLM server started with
``--weight-transfer-config '{"backend": "nccl"}'``; gagar's ``ReplicaClient`` is the control
client. Afterwards vLLM's log-probs must equal the trainer's and the version must have advanced.
The trainer half runs under the vLLM interpreter (it needs vLLM's NCCL wrapper).

    python -m pytest -m gpu tests/gpu/test_vllm_nccl_sync.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gagar import env as env_names
from gagar.rollout.engines.server import REPO_ROOT, ServerConfig, VllmServer, free_port, vllm_python
from gagar.rollout.engines.vllm_auth import control_token
from tests.support.tiny_llama import write_tiny_llama

pytestmark = pytest.mark.gpu

TRAINER = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
from gagar.rollout.engines.weight_sync import ReplicaClient
from gagar.engine.client import OpenAIEngine
from gagar.engine.base import SamplingParams

model_dir, url, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
torch.manual_seed(1)
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.05 * torch.randn_like(p))
client = ReplicaClient(url)
engine = WeightTransferTrainerFactory.trainer_init(
    NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=port, world_size=2, rank=0),
    client=client, source=ModuleSource(model),
)
client.pause()
engine.send_weights()
client.update_weight_version("1")
client.resume()
prompts = [[5, 6, 7, 8], [40, 41, 42]]
out = OpenAIEngine([url]).generate(prompts, SamplingParams(max_tokens=6, seed=5))
gap = 0.0
for group in out:
    c = group[0]
    ids = torch.tensor([c.prompt_ids + c.token_ids]).cuda()
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)[len(c.prompt_ids) - 1 : -1]
    ref = logp.gather(-1, torch.tensor(c.token_ids).cuda()[:, None])[:, 0].cpu()
    gap = max(gap, (ref - torch.tensor(c.logprobs)).abs().max().item())
print(json.dumps({"gap": gap, "version": client.weight_version()}))
engine.shutdown()
"""


def test_nccl_sync_makes_vllm_agree_with_the_trainer(tmp_path: Path):
    model = write_tiny_llama(tmp_path / "tiny")
    cfg = ServerConfig(model=model, weight_transfer_backend="nccl", cpu_kvcache_gib=1)
    cfg.extra_args += ["--gpu-memory-utilization", "0.2"]
    with VllmServer(cfg, tmp_path / "vllm.log") as server:
        script = tmp_path / "trainer.py"
        script.write_text(TRAINER)
        proc = subprocess.run(
            [vllm_python(), str(script), str(model), server.base_url, str(free_port())],
            capture_output=True,
            text=True,
            timeout=600,
            # the server's control routes take this process's token (vllm_auth)
            env={
                "PYTHONPATH": str(REPO_ROOT),
                "PATH": "/usr/bin:/bin",
                env_names.WEIGHT_SYNC_TOKEN: control_token(),
            },
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + "\n" + server.log_tail()
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["version"] == "1"
    assert result["gap"] < 1e-3, result  # float32 on both sides; GPU kernels differ slightly
    print(json.dumps(result), file=sys.stderr)
