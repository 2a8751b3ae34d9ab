"""The one engine protocol: what the agent loop (training rollouts, the held-out evaluation, the
SFT experts) and the agentic grader program against.

RL needs three things from an engine that a chat API alone does not give: the exact token ids
it sampled (re-tokenizing text drifts), the log-probability of each under the policy that
sampled it (for the importance correction), and the policy version that produced them: that is
``Engine.generate``. The grader needs the chat API with tools instead (its transcript is messages,
and the server's tool-call parser turns text into calls): ``ChatEngine.chat``. Both take the same
``SamplingParams``; the vLLM client (``gagar.engine.client.AsyncOpenAIEngine``) implements both,
the tests' scripted engines one or the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class EngineError(RuntimeError):
    """The engine answered with an error or a response missing what RL needs."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling; ``seed`` makes a request reproducible on the same weights."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False  # fixed-length samples (benchmarks); vLLM extension

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    def to_openai(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "n": self.n,
        }
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass(frozen=True)
class Generation:
    """One sampled continuation: exact ids and the sampling policy's log-prob of each."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length" | ...
    prompt_ids: list[int] = field(default_factory=list)
    # The version the replica reported just before serving the request. A sync during the
    # request (pause mode "keep" continues it on the new weights) can mix two versions; the
    # per-token log-probs are still those of the weights that sampled each token.
    policy_version: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise EngineError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


@dataclass(frozen=True)
class ChatReply:
    """One assistant message of a chat completion, and what it cost."""

    message: dict[str, Any]  # role "assistant", content, tool_calls (OpenAI's shape)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""


class ChatEngine(Protocol):
    """Messages (and tools) in, one assistant message out."""

    async def chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] = "auto",
    ) -> ChatReply: ...


class Engine(Protocol):
    """Token ids in, one sampled continuation out (awaitable: many agents share one engine)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...
