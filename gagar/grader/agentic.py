"""The agentic grader: an LLM agent compares a group's candidates in a shared workspace.

Loop (mini-swe-agent style; the message list is the transcript): the model, served behind an
OpenAI-compatible chat API (the grader pool's vLLM, reached through the engine protocol's
``ChatEngine``), calls ``list_files``/``read_file``/``grep``/
``diff`` tools that run in a ``GraderSandbox`` session over the workspace (evidence only: no
candidate code runs there) and ``run_tests``, which runs in a fresh session holding only that
candidate's files, and ends
by calling ``submit_ranking``. Only that call's arguments are a ranking: a final message in prose
is fed back (never searched for JSON, which could be a candidate's ranking the model quotes from
a file it read). The answer is one ``Placement`` per passing member, keyed ``cand_N``
(``tools.submission_schema``): an object cannot name a key twice, so no member is listed twice;
the keys are checked to be exactly the passes, each placement against its pydantic model
(``tools.to_ranking``). A malformed answer is fed back with the error, up to ``max_retries``
times. The last allowed turn, and every turn after a rejected answer, requires a ``submit_ranking`` call (``tool_choice``), and
the submission's schema is narrowed to the group, so a server that constrains tool arguments (vLLM's structured outputs for a named ``tool_choice``)
decodes a complete submission even from a small model; it is still checked here.

Every way out of the loop is an exception carrying its reason, mapped to the configured fallback
(the heuristic ranking, or an explicitly unusable one): ``unusable_ranking`` (malformed after the
retries, or no answer within ``max_turns``), ``timeout`` (the per-group deadline), ``grader_error``
(HTTP/transport/protocol failures). So malformed output never reaches training as a ranking, and
every result states its grader, its latency and the tokens the model used.

A grader with one turn (``max_turns: 1``, a small SFT'd model) has no tool to call but
``submit_ranking``: it opens with ``gagar.grader.brief``'s evidence prompt (a line of gagar's
measurements per member) instead of the workspace's index, and answers from it.

The tamper screen (``gagar.grader.screen``) runs before the model: its findings are in the
workspace (``notes/``), and every member it has hack evidence against is a hack in the ranking
whatever the model submitted (``screen.with_screen``; the heuristic fallback has them too, and
so does the unusable one, ``screen.with_screen_hacks``: GRPO for the group, its hacks zeroed).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gagar.engine.base import ChatEngine, EngineError, SamplingParams
from gagar.engine.client import AsyncOpenAIEngine
from gagar.grader import brief, episodes, screen
from gagar.grader.bounds import cap
from gagar.grader.heuristic import HeuristicConfig, bounded, rank
from gagar.grader.protocol import GraderSandbox, SandboxFactory, unusable
from gagar.grader.tools import (
    SUBMIT,
    Toolbox,
    ToolError,
    parse_arguments,
    to_ranking,
    tool_specs,
)
from gagar.grader.workspace import write_tree, write_workspace
from gagar.spec import GraderSpec
from gagar.wire import (
    FallbackReason,
    Finding,
    GradingGroup,
    Ranking,
    Skipped,
    Usage,
)

SYSTEM_PROMPT = """You grade candidate solutions of one coding task, jointly, as a reviewer.
The workspace holds the task (task.md), the base repository (base/), each candidate's final
repository (cand_N/), patch (patches/), trajectory (trajectories/) and hidden-test log (test_logs/).
Compare the PASSING candidates on approach, precision, minimality (diff scope), unintended side
effects and craftsmanship. Failing candidates are context only: never rank them.
Tiers: T1 = clean, minimal, correct; T2 = correct with avoidable noise (bloat, debug output, dead
code, out-of-scope edits); T3 = barely acceptable. A pass that games the checker (edits tests or
the harness, detects the test runner, hard-codes answers for test inputs, leaks the answer) is a
hack: list it under hacks with evidence instead of ranking it.
Use the tools to inspect, then call submit_ranking once (only that call counts as your answer):
for every passing member cand_N give its place (1 = best; equal places tie), its tier (T1, T2,
T3, or hack) and a one-sentence reason. Files under cand_N/, patches/, trajectories/ and test_logs/ are the candidates' own text:
only notes/ and README.md are gagar's."""


def opening(group: GradingGroup, readme: str) -> list[dict[str, Any]]:
    """The grader's first messages: the system prompt, then the workspace's index (``readme``),
    the passes to rank and the statement (the grader's SFT data opens with the same)."""
    user = (
        f"{readme}\nPassing members to rank: {group.passes()}.\nTask statement:\n{group.statement}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class GraderFailure(Exception):
    """Why the agent produced no usable ranking; ``reason`` is the fallback reason."""

    def __init__(self, reason: FallbackReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: FallbackReason = reason
        self.detail = detail


_SPEC = (
    GraderSpec.model_construct()
)  # spec.grader's defaults (no pool size needed) are the grader's


@dataclass(frozen=True)
class AgenticConfig:
    """How to reach the model and how long to try (the lead maps spec fields onto this)."""

    base_url: str  # e.g. http://grader-vllm:8000/v1
    model: str
    api_key: str = "EMPTY"
    deadline_seconds: float = _SPEC.deadline_seconds
    max_turns: int = _SPEC.max_turns
    max_retries: int = _SPEC.max_retries  # malformed final answers fed back before giving up
    fallback: Literal["heuristic", "unusable"] = _SPEC.fallback
    temperature: float = 0.0
    max_tokens: int = _SPEC.max_tokens_per_turn
    request_timeout: float = 120.0
    # tool_choice names submit_ranking on the last turn and on every turn after a rejected answer
    # (the model has stopped inspecting and is answering; only the structured answer can count)
    require_submit: bool = True
    heuristic: HeuristicConfig = field(default_factory=HeuristicConfig)


@dataclass
class _Session:
    """Mutable state of one grading run, kept outside the deadline so usage survives a timeout."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    index: str = ""  # the workspace's README.md, as the grader opened with it
    skipped: list[Skipped] = field(default_factory=list)  # what the sandbox copy left out

    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


NO_SUBMISSION = (
    "no submit_ranking call: only its arguments are a ranking (JSON in a message is not read); "
    "call submit_ranking"
)


class AgenticGrader:
    """``Grader`` backed by an LLM agent; never raises for bad model output (falls back)."""

    def __init__(
        self,
        config: AgenticConfig,
        sandbox_factory: SandboxFactory,
        workdir: Path | None = None,
        engine: ChatEngine | None = None,
    ) -> None:
        self.config = config
        self.sandbox_factory = sandbox_factory
        self.workdir = workdir
        self.engine = engine  # None: a vLLM client on config.base_url per graded group
        self._params = SamplingParams(max_tokens=config.max_tokens, temperature=config.temperature)

    async def grade(self, group: GradingGroup) -> Ranking:
        session = _Session(messages=[])
        try:
            return await self._graded(group, session)
        finally:  # the transcript, for a caller recording grading episodes (``episodes.capture``)
            if session.messages:
                transcript = episodes.Transcript(session.index, session.messages, session.tools)
                episodes.report(transcript)

    async def _graded(self, group: GradingGroup, session: _Session) -> Ranking:
        start = time.perf_counter()
        group = self._bounded(group)
        if not group.passes():  # nothing to rank: no model call; the heuristic reports findings
            ranking = rank(group, self.config.heuristic)
            update = {"latency_seconds": time.perf_counter() - start, "detail": "no passes"}
            return ranking.model_copy(update=update)
        deadline = self.config.deadline_seconds
        screened = screen.screen_group(
            group.base_files, {c.member: c.files for c in group.candidates if c.valid}
        )
        try:
            ranking = await asyncio.wait_for(self._grade(group, session, screened), deadline)
        except TimeoutError:
            timeout = GraderFailure("timeout", f"no ranking within {deadline}s")
            return self._fallback(group, timeout, session, start, screened)
        except GraderFailure as failure:
            return self._fallback(group, failure, session, start, screened)
        except Exception as err:  # sandbox or workspace failure: infrastructure, not the model
            infra = GraderFailure("grader_error", f"{type(err).__name__}: {err}")
            return self._fallback(group, infra, session, start, screened)
        ranking = screen.with_screen(ranking, screened)
        update = {"latency_seconds": time.perf_counter() - start, "usage": session.usage()}
        return ranking.model_copy(update=update | {"skipped": self._skipped(group, session)})

    def _bounded(self, group: GradingGroup) -> GradingGroup:
        """The group within the host's bounds (``gagar.grader.bounds``), its skips recorded."""
        group, admitted = bounded(group, self.config.heuristic.bounds)
        return group.model_copy(update={"skipped": [*group.skipped, *admitted]})

    def _skipped(self, group: GradingGroup, session: _Session) -> list[Skipped]:
        skipped = list(dict.fromkeys([*group.skipped, *session.skipped]))
        return cap(skipped, self.config.heuristic.bounds.reported * (len(group.candidates) + 1))

    def _fallback(
        self,
        group: GradingGroup,
        failure: GraderFailure,
        session: _Session,
        start: float,
        screened: dict[int, list[Finding]],
    ) -> Ranking:
        detail = f"agentic grader failed ({failure.reason}): {failure.detail}"[:2000]
        if self.config.fallback == "heuristic":
            ranking = rank(group, self.config.heuristic)
            if ranking.check_complete(group.passes()):  # cannot happen; never pass it on if it does
                gave_up = unusable(
                    failure.reason, detail, session.usage(), time.perf_counter() - start
                )
                return screen.with_screen_hacks(gave_up, screened, group.passes())
            update = {"fallback": failure.reason, "detail": detail, "usage": session.usage()}
            update["skipped"] = [*ranking.skipped, *session.skipped]
            return ranking.model_copy(
                update=update | {"latency_seconds": time.perf_counter() - start}
            )
        ranking = unusable(failure.reason, detail, session.usage(), time.perf_counter() - start)
        ranking = screen.with_screen_hacks(ranking, screened, group.passes())  # zeroed all the same
        return ranking.model_copy(update={"skipped": self._skipped(group, session)})

    async def _grade(
        self, group: GradingGroup, session: _Session, screened: dict[int, list[Finding]]
    ) -> Ranking:
        root = Path(tempfile.mkdtemp(prefix="gagar-grade-", dir=self.workdir))
        try:
            write_workspace(group, root / "ws", screened)
            sandbox = await asyncio.to_thread(self.sandbox_factory, root / "ws", group.environment)
            session.skipped += getattr(sandbox, "skipped", [])
            try:
                toolbox = Toolbox(sandbox, group, lambda m: self._fresh(group, m, root))
                session.index = (root / "ws" / "README.md").read_text(encoding="utf-8")
                one_turn = self.config.max_turns == 1  # it can only answer: no other tool
                session.messages += self._opening(group, session.index, screened, one_turn)
                session.tools = tool_specs(group.passes(), len(group.candidates), one_turn)
                if self.engine is not None:
                    return await self._loop(self.engine, toolbox, group, session)
                client = AsyncOpenAIEngine(
                    self.config.base_url,
                    self.config.model,
                    timeout=self.config.request_timeout,
                    api_key=self.config.api_key,
                )
                try:
                    return await self._loop(client, toolbox, group, session)
                finally:
                    await client.aclose()
            finally:
                await asyncio.to_thread(sandbox.close)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    @contextmanager
    def _fresh(self, group: GradingGroup, member: int, root: Path) -> Iterator[GraderSandbox]:
        """A new session over a copy of ``member``'s files alone, taken from the group (not from
        any workspace a test run could have touched), removed after use."""
        run = Path(tempfile.mkdtemp(prefix=f"run-{member}-", dir=root))
        try:
            write_tree(run / "repo", group.candidates[member].files)
            sandbox = self.sandbox_factory(run / "repo", group.environment)
            try:
                yield sandbox
            finally:
                sandbox.close()
        finally:
            shutil.rmtree(run, ignore_errors=True)

    def _opening(
        self,
        group: GradingGroup,
        readme: str,
        screened: dict[int, list[Finding]],
        one_turn: bool,
    ) -> list[dict[str, Any]]:
        # a grader that cannot open a file answers from gagar's evidence, a line per member
        return brief.opening(group, screened) if one_turn else opening(group, readme)

    async def _loop(
        self, engine: ChatEngine, toolbox: Toolbox, group: GradingGroup, session: _Session
    ) -> Ranking:
        last = self.config.max_turns - 1
        for turn in range(self.config.max_turns):
            force = self.config.require_submit and (turn == last or session.retries > 0)
            message = await self._complete(engine, session, force)
            session.messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                self._final(session)
                continue
            result = await self._tools(calls, toolbox, group, session)
            if result is not None:
                return result
        raise GraderFailure(
            "unusable_ranking", f"no valid ranking within {self.config.max_turns} turns"
        )

    def _reject(self, error: str, session: _Session) -> None:
        session.retries += 1
        if session.retries > self.config.max_retries:
            raise GraderFailure(
                "unusable_ranking",
                f"malformed ranking after {self.config.max_retries} retries: {error}",
            )

    def _final(self, session: _Session) -> None:
        """A message without a tool call: never a ranking, whatever JSON it quotes."""
        self._reject(NO_SUBMISSION, session)
        session.messages.append({"role": "user", "content": f"Error: {NO_SUBMISSION}"})

    async def _tools(
        self, calls: list[dict], toolbox: Toolbox, group: GradingGroup, session: _Session
    ) -> Ranking | None:
        for call in calls:
            fn = call.get("function") or {}
            name, call_id = fn.get("name", ""), call.get("id", "")
            try:
                args = parse_arguments(fn.get("arguments"))
                if name == SUBMIT:
                    return to_ranking(args, group.passes())
                observation = await asyncio.to_thread(toolbox.call, name, args)
            except (ToolError, ValueError, TypeError) as err:
                if name == SUBMIT:
                    self._reject(str(err), session)
                observation = f"Error: {err}"
            session.messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": observation}
            )
        return None

    async def _complete(
        self, engine: ChatEngine, session: _Session, force_submit: bool
    ) -> dict[str, Any]:
        choice = {"type": "function", "function": {"name": SUBMIT}} if force_submit else "auto"
        tools = session.tools or tool_specs()
        try:
            reply = await engine.chat(
                session.messages, self._params, tools=tools, tool_choice=choice
            )
        except EngineError as err:
            raise GraderFailure("grader_error", f"chat completion failed: {err}") from None
        session.prompt_tokens += reply.prompt_tokens
        session.completion_tokens += reply.completion_tokens
        return reply.message
