"""The inference-engine protocol the rollout side programs against.

RL needs three things from an engine that a chat API alone does not give: the exact token ids
it sampled (re-tokenizing text drifts), the log-probability of each under the policy that
sampled it (for the importance correction), and the policy version that produced them. One
protocol carries all three; the vLLM implementation and the scripted fake both speak
OpenAI-compatible HTTP, so the same client code drives either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
class Completion:
    """One sampled continuation: exact ids and the sampling policy's log-prob of each."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | ...
    # The version the replica reported just before serving the request. A sync during the
    # request (pause mode "keep" continues it on the new weights) can mix two versions; the
    # per-token log-probs are still those of the weights that sampled each token.
    policy_version: str | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise EngineError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


@dataclass(frozen=True)
class ChatTurn:
    """One assistant turn of a chat with tools, with its exact tokens."""

    message: dict[str, Any]  # OpenAI assistant message: role, content, tool_calls
    completion: Completion
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


@runtime_checkable
class InferenceEngine(Protocol):
    """What the agent loop and the trainer need from a rollout engine."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """Sample ``params.n`` continuations of each token-id prompt (result[i][j])."""
        ...

    def chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatTurn:
        """One assistant turn given the conversation so far and the tool schemas."""
        ...

    def update_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> Any:
        """Load the trainer's ``(hf_name, tensor)`` pairs as policy ``version`` everywhere."""
        ...

    def policy_version(self) -> list[str | None]:
        """The policy version each replica serves now."""
        ...
