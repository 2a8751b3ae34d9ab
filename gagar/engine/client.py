"""The vLLM client: ``Engine`` (the agent loop) and ``ChatEngine`` (the agentic grader) over
OpenAI-compatible HTTP.

Exact tokens come from vLLM's extensions to the OpenAI API: prompts go in as token ids,
``return_token_ids`` returns the sampled ids, ``logprobs`` the sampled token's log-prob. The
server is started with ``--logprobs-mode raw_logprobs``: log-probs of the model's distribution
before temperature or top-p, which is what the trainer recomputes. Chat requests go to
``/v1/chat/completions`` with tools; the reply keeps only the assistant message's role, content
and tool calls (what goes back into the transcript) and the token usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp

from gagar.engine.base import ChatReply, EngineError, Generation, SamplingParams


def openai_base_url(url: str) -> str:
    """The OpenAI-style base URL (ending in ``/v1``) of a server given by its root or its base."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


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


KEEPALIVE_S = 4.0  # an idle connection's life here: below the server's (vLLM: 5 s)


class AsyncOpenAIEngine:
    """One request at a time, awaitable: the shape the agent loop and the grader drive.

    Concurrency comes from many awaiting agents, which vLLM batches continuously. ``base_url`` is
    the server's root or its OpenAI base (``http://host:8000`` or ``http://host:8000/v1``).

    The client is aiohttp's, made on first use in the running event loop, and keeps every
    connection the agents opened alive for their next turn. httpx's async client measured
    3.5-4 ms of CPU per request at 32 concurrent requests (its pool scans every connection per
    request; it keeps 20 alive, so a third of the turns also paid a TCP connect), aiohttp's
    0.2 ms: in the agent loop that CPU is the event loop's, taken from releasing the next turn.
    An idle connection is dropped after ``KEEPALIVE_S``, before vLLM's server closes it (5 s),
    and a request whose connection the server closed under it (the server's close and the reuse
    crossing) is sent once more on another: a generation is safe to ask for twice.
    """

    def __init__(
        self,
        base_url: str,
        model: str = "policy",
        timeout: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        self.model = model
        self.base_url = openai_base_url(base_url)  # named in every error: which server refused
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the session's

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop:
            raise RuntimeError("an AsyncOpenAIEngine serves the event loop it was first used in")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # the agents bound the concurrency
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=self._timeout,
                headers=self._headers,
            )
            self._loop = loop
        return self._session

    async def _send(self, url: str, body: dict[str, Any]) -> tuple[int, bytes]:
        async with self._client().post(url, json=body) as r:
            return r.status, await r.read()

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{route}"
        try:
            try:
                status, raw = await self._send(url, body)
            except aiohttp.ClientConnectionError as e:
                if isinstance(e, aiohttp.ClientConnectorError | TimeoutError):
                    raise  # no server there, or a slow one: not a dropped connection
                status, raw = await self._send(url, body)  # once more, on another connection
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EngineError(f"{url}: {e!r}") from e
        if status >= 400:
            raise EngineError(f"{url} -> {status}: {raw[:500].decode(errors='replace')}")
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise EngineError(
                f"{url}: the response is not JSON: {raw[:200].decode(errors='replace')!r}"
            ) from e
        if not isinstance(data, dict):
            raise EngineError(f"{url}: expected a JSON object, got {type(data).__name__}")
        return data

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
        return parse_completions(await self._post("/completions", body), [prompt_ids], 1, None)[0][
            0
        ]

    async def chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] = "auto",
    ) -> ChatReply:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **params.to_openai()}
        if tools:
            body |= {"tools": tools, "tool_choice": tool_choice}
        data = await self._post("/chat/completions", body)
        try:
            choice = data["choices"][0]
            message = choice["message"]
            usage = data.get("usage") or {}
            kept = {k: v for k, v in message.items() if k in ("content", "tool_calls")}
            return ChatReply(
                message={"role": "assistant", **kept},
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                finish_reason=choice.get("finish_reason") or "",
            )
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise EngineError(
                f"{self.base_url}/chat/completions: malformed response ({type(e).__name__}: {e})"
            ) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session, self._loop = None, None
