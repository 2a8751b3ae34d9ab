"""The agent loop: multi-turn tool calling over an engine and a tool environment, token in, token out.

The loop never re-tokenizes what the policy generated: the trajectory is one growing list of token
ids, where generated tokens carry the engine's log-probs and ``loss_mask = 1``, and prompt and tool
observations (templated by ``ChatFormat``) carry ``loss_mask = 0``. That is what the trainer
trains on, so there is no drift between what was sampled and what is scored.

Shape (mini-swe-agent style): ``while True: await self.step()``; every way out is an ``AgentExit``
carrying its reason (submitted, max_turns, max_tokens, context_overflow, engine_error,
sandbox_error). Engine, chat format and tools sit behind protocols, each with a deterministic fake
in the tests.

After the loop, turns are flagged for segment shaping (docs/design.md §1.7): ``redundant`` (an identical
call repeated with no state change in between), ``tool_error`` (unparseable call or a tool that
rejected its arguments) and ``churn`` (an edit whose result a later edit overwrote or reverted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# The one engine protocol (re-exported: the agent's callers and fakes import it from here too).
from gagar.engine.base import Engine, Generation, SamplingParams

ExitReason = Literal[
    "submitted", "max_turns", "max_tokens", "context_overflow", "engine_error", "sandbox_error"
]
INFRA_EXITS = frozenset({"engine_error", "sandbox_error"})
FLAG_KINDS = ("redundant", "tool_error", "churn")


# ----------------------------------------------------------------------------- protocols
@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        return json.dumps([self.name, self.arguments], sort_keys=True)


@dataclass(frozen=True)
class Observation:
    text: str
    error: bool = False
    """The call was rejected (bad arguments, unknown tool): flagged ``tool_error``."""
    changed_state: bool = False
    """The call modified the workspace (edits, file creation, commands that write)."""
    done: bool = False
    """The agent submitted."""


class ChatFormat(Protocol):
    def initial_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the system/user messages followed by the assistant generation prompt."""
        ...

    def observation_ids(self, message: dict[str, Any]) -> list[int]:
        """Token ids appended after an assistant turn: the tool message and the next prompt."""
        ...

    def parse_tool_call(self, text: str) -> ToolCall:
        """The tool call in an assistant turn; raises ``ValueError`` with a message for the model."""
        ...


class Tools(Protocol):
    def definitions(self) -> list[dict[str, Any]]: ...

    async def execute(self, call: ToolCall) -> Observation: ...


class SandboxInfraError(RuntimeError):
    """Raised by tools when the sandbox itself failed (not the code run inside it)."""


# ----------------------------------------------------------------------------- exits
class AgentExit(Exception):
    """The one way out of ``Agent.step``: the reason the trajectory ended, and a detail."""

    def __init__(self, reason: ExitReason, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


# ----------------------------------------------------------------------------- trajectory
@dataclass
class Turn:
    start: int
    """Index of the turn's first generated token in ``Trajectory.token_ids``."""
    end: int
    """One past its last generated token."""
    text: str
    call: ToolCall | None
    observation: Observation | None = None
    flags: set[str] = field(default_factory=set)


@dataclass
class Trajectory:
    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    prompt_len: int
    messages: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    exit_reason: ExitReason | None = None
    exit_detail: str = ""
    policy_version: int | None = None
    """The policy version that sampled every token of it (stamped by the driver's rollouts)."""

    @property
    def valid(self) -> bool:
        """False when an infrastructure failure ended it: dropped from statistics and loss."""
        return self.exit_reason not in INFRA_EXITS

    @property
    def response_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def flagged_mask(self, kinds: tuple[str, ...] = FLAG_KINDS) -> list[bool]:
        """Per token: True for generated tokens of a turn flagged with one of ``kinds``."""
        mask = [False] * len(self.token_ids)
        for turn in self.turns:
            if turn.flags & set(kinds):
                mask[turn.start : turn.end] = [True] * (turn.end - turn.start)
        return mask

    def flag_counts(self) -> dict[str, int]:
        return {k: sum(k in t.flags for t in self.turns) for k in FLAG_KINDS}


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int
    max_tokens_per_turn: int
    max_context_tokens: int
    max_response_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0


class Agent:
    """Runs one trajectory. Construct one per trajectory; ``await agent.run(messages)``."""

    def __init__(
        self,
        engine: Engine,
        fmt: ChatFormat,
        tools: Tools,
        limits: AgentLimits,
        seed: int | None = None,
    ) -> None:
        self.engine, self.fmt, self.tools, self.limits, self.seed = engine, fmt, tools, limits, seed
        self.traj: Trajectory | None = None

    async def run(self, messages: list[dict[str, Any]]) -> Trajectory:
        ids = self.fmt.initial_ids(messages)
        self.traj = Trajectory(
            list(ids), [0.0] * len(ids), [0] * len(ids), len(ids), list(messages)
        )
        try:
            while True:
                await self.step()
        except AgentExit as exit_:
            self.traj.exit_reason, self.traj.exit_detail = exit_.reason, str(exit_)
        flag_turns(self.traj.turns)
        return self.traj

    async def step(self) -> None:
        traj, lim = self._traj(), self.limits
        if len(traj.turns) >= lim.max_turns:
            raise AgentExit("max_turns", f"reached {lim.max_turns} turns")
        budget = min(lim.max_tokens_per_turn, lim.max_context_tokens - len(traj.token_ids))
        if budget <= 0:
            raise AgentExit(
                "context_overflow", f"context of {len(traj.token_ids)} tokens reached the limit"
            )
        gen = await self._generate(budget)
        turn = self._append_generation(gen)
        if gen.finish_reason == "length" and len(traj.token_ids) >= lim.max_context_tokens:
            raise AgentExit("context_overflow", "generation ran into the context limit")
        if lim.max_response_tokens is not None and traj.response_tokens >= lim.max_response_tokens:
            raise AgentExit("max_tokens", f"generated {traj.response_tokens} tokens")
        observation = await self._act(turn, gen)
        if observation.done:
            raise AgentExit("submitted", observation.text[:200])
        self._append_observation(observation)

    def _traj(self) -> Trajectory:
        assert self.traj is not None, "run() starts the trajectory"
        return self.traj

    async def _generate(self, budget: int) -> Generation:
        traj, lim = self._traj(), self.limits
        seed = None if self.seed is None else self.seed + len(traj.turns)
        params = SamplingParams(
            max_tokens=budget, temperature=lim.temperature, top_p=lim.top_p, seed=seed
        )
        try:
            gen = await self.engine.generate(list(traj.token_ids), params)
        except Exception as err:  # any engine failure is infrastructure, never the policy's fault
            raise AgentExit("engine_error", f"{type(err).__name__}: {err}") from err
        if len(gen.token_ids) != len(gen.logprobs) or not gen.token_ids:
            raise AgentExit(
                "engine_error",
                f"engine returned {len(gen.token_ids)} tokens and {len(gen.logprobs)} log-probs",
            )
        return gen

    def _append_generation(self, gen: Generation) -> Turn:
        traj = self._traj()
        start = len(traj.token_ids)
        traj.token_ids += gen.token_ids
        traj.logprobs += gen.logprobs
        traj.loss_mask += [1] * len(gen.token_ids)
        traj.messages.append({"role": "assistant", "content": gen.text})
        turn = Turn(start, len(traj.token_ids), gen.text, None)
        traj.turns.append(turn)
        return turn

    async def _act(self, turn: Turn, gen: Generation) -> Observation:
        if gen.finish_reason == "length":
            turn.observation = Observation(
                "Your message was cut off before a complete tool call.", error=True
            )
            return turn.observation
        try:
            turn.call = self.fmt.parse_tool_call(gen.text)
        except ValueError as err:
            turn.observation = Observation(f"Invalid tool call: {err}", error=True)
            return turn.observation
        try:
            turn.observation = await self.tools.execute(turn.call)
        except SandboxInfraError as err:
            raise AgentExit("sandbox_error", str(err)) from err
        return turn.observation

    def _append_observation(self, observation: Observation) -> None:
        traj = self._traj()
        message = {"role": "tool", "content": observation.text}
        traj.messages.append(message)
        ids = self.fmt.observation_ids(message)
        traj.token_ids += ids
        traj.logprobs += [0.0] * len(ids)
        traj.loss_mask += [0] * len(ids)


# ----------------------------------------------------------------------------- flags
def flag_turns(turns: list[Turn]) -> None:
    """Mark ``redundant``, ``tool_error`` and ``churn`` turns (docs/design.md §1.7)."""
    seen: set[str] = set()
    for turn in turns:
        obs = turn.observation
        if obs is not None and obs.error:
            turn.flags.add("tool_error")
        if turn.call is None or obs is None:
            continue
        if turn.call.key() in seen:
            turn.flags.add("redundant")
        seen.add(turn.call.key())
        if obs.changed_state:
            seen = set()  # the state changed: repeating an earlier call is informative again
    _flag_churn(turns)


def _edit_of(turn: Turn) -> tuple[str, str, str] | None:
    """(path, old, new) of a successful edit or file creation."""
    call, obs = turn.call, turn.observation
    if call is None or obs is None or obs.error or not obs.changed_state:
        return None
    args = call.arguments
    if call.name == "edit" and isinstance(args.get("path"), str):
        return args["path"], str(args.get("old", "")), str(args.get("new", ""))
    if call.name == "create" and isinstance(args.get("path"), str):
        return args["path"], "", str(args.get("content", ""))
    return None


def _flag_churn(turns: list[Turn]) -> None:
    edits = [(i, e) for i, t in enumerate(turns) if (e := _edit_of(t)) is not None]
    for pos, (i, (path, _old, new)) in enumerate(edits):
        for _j, (later_path, later_old, _later_new) in edits[pos + 1 :]:
            overwritten = bool(new.strip()) and new.strip() in later_old
            recreated = (
                (call := turns[i].call) is not None and call.name == "create" and later_old == ""
            )
            if later_path == path and (overwritten or recreated):
                turns[i].flags.add("churn")
                break
