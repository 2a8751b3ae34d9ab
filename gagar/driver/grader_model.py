"""The agentic grader's model server in the embedded runner: ``gagar train`` serves
``spec.grader.model`` with vLLM itself when the agentic grader has no ``endpoint``.

The grader's model is frozen (never synced), so it is a second vLLM server next to the policy's,
even when it is the same model. The agentic grader talks to it through the OpenAI ``tools`` API,
which vLLM answers with HTTP 400 unless the server runs a tool-call parser
(``--enable-auto-tool-choice --tool-call-parser``); the server is started with one, and a one-token
request with a tool proves it before the first step, so a misconfigured grader fails the start
instead of silently falling back on every group.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from gagar.driver.components import SetupError, pretrained
from gagar.rollout.engines.server import ServerConfig, VllmServer
from gagar.spec import GRADER_SERVED_NAME, HUB_MODELS, GraderSpec

_PRESETS = tuple(HUB_MODELS)  # the pretrained presets (gagar.trainer.model.fetch.MODELS)
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "noop",
        "description": "Does nothing.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def needs_server(spec: GraderSpec) -> bool:
    return spec.kind == "agentic" and spec.endpoint is None


def model_dir(spec: GraderSpec) -> Path:
    """``spec.grader.model`` as a local HF folder: a preset from the model cache, or a path."""
    assert spec.model is not None  # the spec requires model or endpoint for the agentic grader
    if spec.model in _PRESETS:
        return pretrained(spec.model, "spec.grader.model")
    if "://" in spec.model:
        raise SetupError(
            f"spec.grader.model {spec.model!r}: object-store URIs are read by cluster runs only; "
            "give a local HF folder or a preset name"
        )
    path = Path(spec.model)
    if not (path / "config.json").is_file():
        raise SetupError(f"spec.grader.model {spec.model!r}: no HF checkpoint (config.json) there")
    return path


def server_config(spec: GraderSpec, model: Path) -> ServerConfig:
    """A small CPU footprint and a fast start: one thread, one process for the engine, eager
    mode; the model's own context length."""
    return ServerConfig(
        model=model,
        served_name=GRADER_SERVED_NAME,
        tool_call_parser=spec.tool_call_parser,
        enforce_eager=True,
        threads=1,
        executor_backend="uni",
    )


def launch(spec: GraderSpec, out: Path) -> VllmServer | None:
    """Start the grader's model server (not waiting), or None when the run does not need one."""
    if not needs_server(spec):
        return None
    server = VllmServer(server_config(spec, model_dir(spec)), out / "logs" / "vllm-grader.log")
    return server.launch()


def ready(server: VllmServer, timeout: float = 900.0) -> None:
    """Wait for the server, then check that it accepts a request with tools."""
    server.wait_ready(timeout)
    check_tool_calling(f"{server.base_url}/v1", GRADER_SERVED_NAME)


def check_tool_calling(base_url: str, model: str) -> None:
    """One generated token for a request with a tool; the server's refusal becomes a SetupError."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "tools": [_PROBE_TOOL],
        "tool_choice": "auto",
        "max_tokens": 1,
    }
    try:
        resp = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120)
    except httpx.HTTPError as err:
        raise SetupError(f"spec.grader: the grader's model server at {base_url}: {err}") from err
    if resp.status_code != 200:
        raise SetupError(
            f"spec.grader.toolCallParser: the grader's model server refuses tool calls "
            f"(HTTP {resp.status_code}): {resp.text[:500]}"
        )
