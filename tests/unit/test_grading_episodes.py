"""Grading episodes: each group a run grades is one JSONL record in the run directory, with the
agentic grader's messages and tool calls, its ranking and fallback reason."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from types import SimpleNamespace

from gagar.driver import loop
from gagar.grader import episodes
from gagar.grader.agentic import AgenticConfig, AgenticGrader
from gagar.grader.local_sandbox import unsafe_local_factory
from gagar.grader.protocol import HeuristicGrader
from gagar.grader.sample import sample_group
from gagar.spec import GraderSpec
from tests.support.fake_openai import FakeOpenAI, text, tool_call


def _answer(body: dict) -> dict:
    """Lists the files once, then places the passes in the order shown."""
    if not any(m["role"] == "tool" for m in body["messages"]):
        return tool_call("list_files", {})
    (submit,) = [t for t in body["tools"] if t["function"]["name"] == "submit_ranking"]
    keys = submit["function"]["parameters"]["required"]
    placed = {k: {"place": i + 1, "tier": "T1", "reason": "ok"} for i, k in enumerate(keys)}
    return tool_call("submit_ranking", placed)


@dataclass(frozen=True, eq=False)
class _Group:
    """What ``_grade`` reads of a ``GroupResult`` beside its wire form (``grading_group`` is
    patched): the task's held-back tests and each member's outcome on them."""

    key: str = "g"
    held_back: tuple[str, ...] = ()
    overfit: tuple[bool, ...] = (False, False, False)

    @property
    def task(self) -> SimpleNamespace:
        return SimpleNamespace(held_back=list(self.held_back))

    @property
    def rollouts(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(overfit=o) for o in self.overfit]


def _ctx(grader, tmp_path, fallback="heuristic"):
    spec = GraderSpec.model_construct(deadline_seconds=30.0, fallback=fallback)
    services = SimpleNamespace(grader=grader, fallback_grader=HeuristicGrader())
    run = SimpleNamespace(spec=SimpleNamespace(grader=spec))
    return SimpleNamespace(run=run, services=services, out=tmp_path, step=4, version=5)


def test_each_graded_group_of_a_run_is_one_record(tmp_path, monkeypatch):
    groups = {
        f"g{i}": sample_group().model_copy(update={"task_id": f"task-{i}", "statement": f"S{i}"})
        for i in range(3)
    }
    monkeypatch.setattr(loop, "grading_group", lambda g: groups[g.key])
    with FakeOpenAI([_answer] * 6) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        ctx = _ctx(AgenticGrader(config, unsafe_local_factory, tmp_path), tmp_path)

        async def grade_all():
            return await asyncio.gather(*(loop._grade(ctx, _Group(g)) for g in groups))

        rankings = asyncio.run(grade_all())
    assert all(r.grader == "agentic" for r in rankings)
    records = [json.loads(x) for x in (tmp_path / episodes.EPISODES_FILE).read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == ["task-0", "task-1", "task-2"]
    for r in records:  # concurrent gradings never mix their transcripts
        assert r["step"] == 5 and r["policy_version"] == 5 and r["fallback"] is None
        own = r["task_id"].replace("task-", "S")
        assert r["messages"][1]["content"].endswith(own) and "cand_0" in r["workspace_index"]
        calls = [c["function"]["name"] for m in r["messages"] for c in m.get("tool_calls") or []]
        assert calls == ["list_files", "submit_ranking"]
        assert r["passes"] == [0, 1, 2] and r["ranking"]["tied_groups"][0]["members"] == [0]


def test_a_fallback_is_recorded_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "grading_group", lambda g: sample_group())
    with FakeOpenAI([text("no idea")] * 4) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m", max_retries=1)
        ctx = _ctx(AgenticGrader(config, unsafe_local_factory, tmp_path), tmp_path)
        ranking = asyncio.run(loop._grade(ctx, _Group()))
    (record,) = [
        json.loads(x) for x in (tmp_path / episodes.EPISODES_FILE).read_text().splitlines()
    ]
    assert record["fallback"] == ranking.fallback == "unusable_ranking"
    assert record["grader"] == "heuristic" and "malformed" in record["detail"]
    assert [m["content"] for m in record["messages"] if m["role"] == "assistant"] == ["no idea"] * 2


def test_a_grader_without_a_transcript_still_gets_a_record(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "grading_group", lambda g: sample_group())
    asyncio.run(loop._grade(_ctx(HeuristicGrader(), tmp_path), _Group()))
    (record,) = [
        json.loads(x) for x in (tmp_path / episodes.EPISODES_FILE).read_text().splitlines()
    ]
    assert record["grader"] == "heuristic" and record["messages"] is None
    assert record["ranking"]["tied_groups"]


def test_an_episode_says_which_passes_broke_held_back_tests(tmp_path, monkeypatch):
    """The label the grader cannot see and the reward never ran (issue 48): per pass, whether it
    also passed its task's held-back tests; None for a task that holds none back."""
    monkeypatch.setattr(loop, "grading_group", lambda g: sample_group())
    ctx = _ctx(HeuristicGrader(), tmp_path)
    broke = _Group(held_back=("tests/test_x.py::test_edge",), overfit=(False, True, False))
    asyncio.run(loop._grade(ctx, broke))
    asyncio.run(loop._grade(ctx, _Group()))
    first, second = [
        json.loads(x) for x in (tmp_path / episodes.EPISODES_FILE).read_text().splitlines()
    ]
    assert first["passes"] == [0, 1, 2]
    assert first["held_back"] == {"0": True, "1": False, "2": True}
    assert second["held_back"] is None
