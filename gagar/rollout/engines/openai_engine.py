"""The vLLM client of the agent loop: ``Engine`` over OpenAI-compatible HTTP.

Exact tokens come from vLLM's extensions to the OpenAI API: prompts go in as token ids,
``return_token_ids`` returns the sampled ids, ``logprobs`` the sampled token's log-prob. The
server is started with ``--logprobs-mode raw_logprobs``: log-probs of the model's distribution
before temperature or top-p, which is what the trainer recomputes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from gagar.rollout.engines.base import EngineError, Generation, SamplingParams


def parse_completions(
    body: dict[str, Any], prompts: Sequence[Sequence[int]], n: int, version: str | None
) -> list[list[Generation]]:
    """Group a /v1/completions response's choices by prompt (OpenAI orders them i*n + j)."""
    choices = sorted(body.get("choices", []), key=lambda c: c["index"])
    if len(choices) != len(prompts) * n:
        raise EngineError(f"expected {len(prompts) * n} choices, got {len(choices)}")
    out: list[list[Generation]] = [[] for _ in prompts]
    for c in choices:
        i = c["index"] // n
        ids, lps = c.get("token_ids"), (c.get("logprobs") or {}).get("token_logprobs")
        if ids is None or lps is None:
            raise EngineError("response lacks token_ids/logprobs: is this a vLLM server?")
        out[i].append(
            Generation(
                ids,
                [float(x) for x in lps],
                c["text"],
                c.get("finish_reason") or "",
                list(prompts[i]),
                version,
            )
        )
    return out


class AsyncOpenAIEngine:
    """One prompt at a time, awaitable: the shape the agent loop drives (token in, token out).

    Concurrency comes from many awaiting agents, which vLLM batches continuously.
    """

    def __init__(self, base_url: str, model: str = "policy", timeout: float = 600.0) -> None:
        self.model = model
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("the prompt needs at least one token id")
        body = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "logprobs": 0,
            "return_token_ids": True,
            **params.to_openai(),
        }
        try:
            r = await self._http.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise EngineError(f"{self._http.base_url}/v1/completions: {e!r}") from e
        if r.status_code >= 400:
            raise EngineError(f"/v1/completions -> {r.status_code}: {r.text[:500]}")
        return parse_completions(r.json(), [prompt_ids], 1, None)[0][0]

    async def aclose(self) -> None:
        await self._http.aclose()
