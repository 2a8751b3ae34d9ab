"""A batched, multi-replica client of vLLM's OpenAI API (completions and chat with tools), for
tests and benchmarks that drive vLLM servers directly; the loop itself uses ``AsyncOpenAIEngine``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from gagar.engine.base import EngineError, Generation, SamplingParams
from gagar.engine.client import parse_completions
from gagar.rollout.engines.vllm_auth import control_token
from gagar.rollout.engines.weight_sync import ReplicaClient, SafetensorsWeightSync, SyncReport


@dataclass(frozen=True)
class ChatTurn:
    """One assistant turn of a chat with tools, with its exact tokens."""

    message: dict[str, Any]  # OpenAI assistant message: role, content, tool_calls
    completion: Generation
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@runtime_checkable
class InferenceEngine(Protocol):
    """A batched engine: several prompts at once, chat turns, weight updates."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Generation]]: ...

    def chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatTurn: ...

    def update_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> Any: ...

    def policy_version(self) -> list[str | None]: ...


def parse_chat(body: dict[str, Any], version: str | None) -> ChatTurn:
    """One chat choice → ChatTurn with exact prompt ids, sampled ids and their log-probs."""
    if not body.get("choices"):
        raise EngineError(f"chat response has no choices: {str(body)[:300]}")
    c = body["choices"][0]
    ids, content = c.get("token_ids"), (c.get("logprobs") or {}).get("content")
    prompt_ids = body.get("prompt_token_ids")
    if ids is None or content is None or prompt_ids is None:
        raise EngineError("chat response lacks token ids/logprobs: is this a vLLM server?")
    message = {k: v for k, v in c["message"].items() if v is not None}
    completion = Generation(
        ids,
        [float(t["logprob"]) for t in content],
        message.get("content") or "",
        c.get("finish_reason") or "",
        prompt_ids,
        version,
    )
    return ChatTurn(message, completion, list(message.get("tool_calls") or []))


def split_even(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Contiguous, near-equal slices (some possibly empty) preserving order."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (1 if p < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


class OpenAIEngine:
    """The rollout engine: one or more vLLM replicas behind their OpenAI-compatible API."""

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str = "policy",
        weight_sync: SafetensorsWeightSync | None = None,
        timeout: float = 600.0,
    ) -> None:
        if not base_urls:
            raise ValueError("OpenAIEngine needs at least one base URL")
        self.model, self.weight_sync = model, weight_sync
        auth = {"Authorization": f"Bearer {control_token()}"}  # /weight_info is a control route
        self._http = [
            httpx.Client(base_url=u.rstrip("/"), timeout=timeout, headers=auth) for u in base_urls
        ]
        self._next = 0  # round-robin cursor for chat requests
        self._pool = ThreadPoolExecutor(max_workers=max(4, len(base_urls)))

    def _post(self, client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = client.post(path, json=body)
        except httpx.HTTPError as e:
            raise EngineError(f"{client.base_url}{path}: {e!r}") from e
        if r.status_code >= 400:
            raise EngineError(f"{client.base_url}{path} -> {r.status_code}: {r.text[:500]}")
        return r.json()

    def _version(self, client: httpx.Client) -> str | None:
        try:
            r = client.get("/weight_info")
            return r.json().get("weight_version") if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def _generate_on(
        self, client: httpx.Client, prompts: list[list[int]], params: SamplingParams
    ) -> list[list[Generation]]:
        if not prompts:
            return []
        body = {"model": self.model, "prompt": prompts, "logprobs": 0, "return_token_ids": True}
        body.update(params.to_openai())
        version = self._version(client)
        return parse_completions(
            self._post(client, "/v1/completions", body), prompts, params.n, version
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Generation]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token id")
        shards = split_even([list(p) for p in prompts], len(self._http))
        futures = [
            self._pool.submit(self._generate_on, c, s, params)
            for c, s in zip(self._http, shards, strict=True)
        ]
        return [group for f in futures for group in f.result()]

    def chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatTurn:
        client = self._http[self._next % len(self._http)]
        self._next += 1
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        body.update(params.to_openai())
        body.update({"logprobs": True, "top_logprobs": 0, "return_token_ids": True})
        if tools:
            body["tools"] = tools
        version = self._version(client)
        return parse_chat(self._post(client, "/v1/chat/completions", body), version)

    def update_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> SyncReport:
        if self.weight_sync is None:
            raise EngineError("this engine was built without a weight sync")
        return self.weight_sync.sync(weights, version)

    def policy_version(self) -> list[str | None]:
        return [self._version(c) for c in self._http]

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for c in self._http:
            c.close()


def engine_for_servers(
    base_urls: Sequence[str], publish_root: Any, base_model: Any, model: str = "policy"
) -> OpenAIEngine:
    """An engine whose weight sync publishes under ``publish_root`` and loads into every URL."""
    sync = SafetensorsWeightSync([ReplicaClient(u) for u in base_urls], publish_root, base_model)
    sync.init()
    return OpenAIEngine(base_urls, model=model, weight_sync=sync)
