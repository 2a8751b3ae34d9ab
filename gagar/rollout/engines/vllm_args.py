"""The arguments of a vLLM server configured for gagar, in one place.

The embedded server (``engines.server.server_command``, ``gagar train``, ``gagar rollout serve``)
and the operator's pods (``operator.builders.pools``: the rollout pool and the agentic grader's
model server) both take their vLLM options from ``vllm_args``, so what the cluster runs cannot
drift from what the tests run. Pure (no vLLM import, no I/O): the builders use it.

A *policy* server (``weight_transfer_backend`` set) gets what RL needs: the weight-transfer API
(``--weight-transfer-config``; the routes also need ``VLLM_SERVER_DEV_MODE=1`` in the
environment, and are guarded by a token: ``--middleware`` ``vllm_auth.ControlAuth``, which reads
``$GAGAR_WEIGHT_SYNC_TOKEN``) and exact log-probs of the sampled tokens (``--logprobs-mode raw_logprobs``: before
any temperature or penalty, which the importance ratio needs). A model that answers OpenAI tool
calls (the agentic grader's) gets ``--enable-auto-tool-choice`` with its ``tool_call_parser``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_LOGPROBS = 20
CONTROL_AUTH = "gagar.rollout.engines.vllm_auth.ControlAuth"  # vllm_auth.MIDDLEWARE, kept pure


@dataclass(frozen=True)
class VllmArgs:
    """What differs between gagar's vLLM servers; everything else is fixed in ``vllm_args``."""

    host: str
    port: int
    served_name: str
    weight_transfer_backend: str | None = None  # set: a policy server (RL weight updates)
    dtype: str | None = None  # None: the model config's
    max_model_len: int | None = None  # None: the model config's context length
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None  # None: vLLM's default
    tool_call_parser: str | None = None  # None: tool calls stay text
    load_format: str | None = None  # e.g. runai_streamer for s3:// and gs:// models
    enforce_eager: bool = False


def vllm_args(a: VllmArgs) -> list[str]:
    """vLLM server options (everything but the model) for ``a``."""
    args = ["--host", a.host, "--port", str(a.port), "--served-model-name", a.served_name]
    if a.dtype:
        args += ["--dtype", a.dtype]
    if a.max_model_len:
        args += ["--max-model-len", str(a.max_model_len)]
    if a.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(a.tensor_parallel_size)]
    if a.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
    if a.load_format:
        args += ["--load-format", a.load_format]
    # Prefix caching stays on (agent turns share long prefixes): vLLM resets it on weight updates.
    if a.weight_transfer_backend:
        args += ["--weight-transfer-config", json.dumps({"backend": a.weight_transfer_backend})]
        args += ["--max-logprobs", str(MAX_LOGPROBS), "--logprobs-mode", "raw_logprobs"]
        # the weight-update routes need a token (``vllm_auth``), not only a NetworkPolicy
        args += ["--middleware", CONTROL_AUTH]
    if a.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", a.tool_call_parser]
    if a.enforce_eager:
        args.append("--enforce-eager")
    return args
