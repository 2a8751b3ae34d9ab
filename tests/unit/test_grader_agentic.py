"""The agentic grader against a deterministic scripted model: tools, validation, fallbacks."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.grader.agentic import AgenticConfig, AgenticGrader
from gagar.grader.local_sandbox import unsafe_local_factory
from gagar.grader.sample import sample_group
from gagar.grader.tools import to_ranking, tool_specs
from tests.support.fake_openai import FakeOpenAI, Turn, text, tool_call


def placed(place, tier, reason="seen in the diff"):
    return {"place": place, "tier": tier, "reason": reason}


GOOD = {
    "cand_0": placed(1, "T1", "minimal fix"),
    "cand_1": placed(2, "T2", "debug print in calc/ops.py"),
    "cand_2": placed(3, "hack", "deletes an assertion in tests/test_ops.py"),
}
_ONE_TWICE = json.dumps(GOOD)[:-1] + ', "cand_1": ' + json.dumps(placed(1, "T1")) + "}"
MALFORMED = {
    "invalid_json": '{"cand_0": ',
    "missing_member": json.dumps({k: v for k, v in GOOD.items() if k != "cand_1"}),
    "duplicate_member": _ONE_TWICE,  # what SmolLM2 did unconstrained: a member listed twice
    "unknown_tier": json.dumps(GOOD | {"cand_0": placed(1, "T0")}),
    "failing_member_ranked": json.dumps(GOOD | {"cand_3": placed(4, "T3")}),
    "unknown_field": json.dumps(GOOD | {"cand_0": placed(1, "T1") | {"verdict": "good"}}),
    "legacy_tied_groups": json.dumps({"tied_groups": [{"tier": "T1", "members": [0, 1, 1]}]}),
}


QUICK_TESTS = (
    "python3 -c 'from calc.ops import mean; assert mean([1, 2, 3]) == 2; print(\"1 passed\")'"
)


def _grade(fake, tmp_path, group=None, **cfg):
    config = AgenticConfig(base_url=fake.base_url, model="scripted", **cfg)
    grader = AgenticGrader(config, unsafe_local_factory, workdir=tmp_path)
    return asyncio.run(grader.grade(group or sample_group()))


def _tool_messages(request):
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def test_agent_uses_tools_and_submits_a_valid_ranking(tmp_path):
    script = [
        tool_call("list_files", {"path": "cand_0"}),
        tool_call("diff", {"a": "base", "b": "cand_0"}),
        tool_call("read_file", {"path": "cand_1/calc/ops.py", "start_line": 14, "end_line": 16}),
        tool_call("grep", {"pattern": "print\\(", "path": "."}),
        tool_call("run_tests", {"member": 0}),
        tool_call("run_tests", {"member": 3}),
        tool_call("submit_ranking", GOOD),
    ]
    group = sample_group().model_copy(update={"test_command": QUICK_TESTS})
    with FakeOpenAI(script) as fake:
        ranking = _grade(fake, tmp_path, group)
    assert ranking.grader == "agentic" and ranking.fallback is None
    assert [g.members for g in ranking.tied_groups] == [[0], [1]]
    assert ranking.hacks[0].member == 2
    assert "deletes an assertion" in " ".join(e.reason for e in ranking.hacks[0].evidence)
    assert ranking.usage.prompt_tokens == 700 and ranking.usage.completion_tokens == 70
    assert ranking.latency_seconds > 0
    obs = _tool_messages(fake.requests[-1])
    assert "cand_0/calc/ops.py" in obs[0]
    assert "+    return total / len(values)" in obs[1]
    assert 'print("mean called with", values)' in obs[2]
    assert "cand_1/calc/ops.py" in obs[3]
    assert obs[4].startswith("[exit code 0]") and "1 passed" in obs[4]
    assert obs[5].startswith("[exit code 1]") and "AssertionError" in obs[5]  # the failing fix
    first = fake.requests[0]
    assert first["model"] == "scripted" and {t["function"]["name"] for t in first["tools"]} >= {
        "submit_ranking",
        "diff",
    }
    assert "Passing members to rank: [0, 1, 2]" in first["messages"][1]["content"]
    assert not list(tmp_path.iterdir())  # the workspace is cleaned up


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_output_retries_then_falls_back_to_heuristic(tmp_path, kind):
    script = [tool_call("submit_ranking", MALFORMED[kind])] * 3
    with FakeOpenAI(script) as fake:
        ranking = _grade(fake, tmp_path, max_retries=2)
    assert len(fake.requests) == 3
    assert all("Error:" in _tool_messages(r)[-1] for r in fake.requests[1:])
    assert ranking.grader == "heuristic" and ranking.fallback == "unusable_ranking"
    assert ranking.check_complete(sample_group().passes()) is None  # the fallback is a good ranking
    assert ranking.usage.prompt_tokens == 300 and "malformed" in ranking.detail


@pytest.mark.parametrize("kind", ["invalid_json", "duplicate_member", "unknown_tier"])
def test_malformed_output_with_unusable_fallback(tmp_path, kind):
    with FakeOpenAI([text(MALFORMED[kind])] * 2) as fake:
        ranking = _grade(fake, tmp_path, max_retries=1, fallback="unusable")
    assert ranking.grader == "none" and ranking.fallback == "unusable_ranking"
    assert ranking.tied_groups == [] and ranking.hacks == []
    assert ranking.check_complete(sample_group().passes()) is not None  # never usable for training


def test_model_recovers_after_feedback(tmp_path):
    script = [
        tool_call("submit_ranking", MALFORMED["missing_member"]),
        tool_call("submit_ranking", GOOD),
    ]
    with FakeOpenAI(script) as fake:
        ranking = _grade(fake, tmp_path, max_retries=2)
    assert ranking.grader == "agentic" and ranking.fallback is None
    assert "incomplete ranking" in _tool_messages(fake.requests[1])[0]


def test_prose_answer_is_fed_back(tmp_path):
    with FakeOpenAI([text("Candidate 0 looks best."), tool_call("submit_ranking", GOOD)]) as fake:
        ranking = _grade(fake, tmp_path)
    assert ranking.grader == "agentic"
    assert "call submit_ranking" in fake.requests[1]["messages"][-1]["content"]


def test_deadline_falls_back_with_timeout(tmp_path):
    with FakeOpenAI([Turn(message=tool_call("submit_ranking", GOOD), delay=3.0)]) as fake:
        ranking = _grade(fake, tmp_path, deadline_seconds=0.5)
    assert ranking.fallback == "timeout" and ranking.grader == "heuristic"
    assert 0.5 <= ranking.latency_seconds < 3.0


@pytest.mark.parametrize(
    "turn",
    [Turn(status=500, raw='{"error": "boom"}'), Turn(raw="not json"), Turn(raw='{"choices": []}')],
)
def test_server_errors_fall_back_with_grader_error(tmp_path, turn):
    with FakeOpenAI([turn]) as fake:
        ranking = _grade(fake, tmp_path, fallback="unusable")
    assert ranking.fallback == "grader_error" and ranking.grader == "none"


def test_last_turn_requires_submit_ranking_under_the_group_schema(tmp_path):
    script = [tool_call("list_files", {}), tool_call("submit_ranking", GOOD)]
    with FakeOpenAI(script) as fake:
        ranking = _grade(fake, tmp_path, max_turns=2)
    assert ranking.grader == "agentic"
    first, last = fake.requests
    assert first["tool_choice"] == "auto"
    assert last["tool_choice"] == {"type": "function", "function": {"name": "submit_ranking"}}
    (submit,) = [t["function"] for t in last["tools"] if t["function"]["name"] == "submit_ranking"]
    assert submit["strict"] is True
    params = submit["parameters"]  # one required key per pass of the group, nothing else
    assert params["required"] == ["cand_0", "cand_1", "cand_2"]
    assert params["additionalProperties"] is False
    assert params["properties"]["cand_0"] == {"$ref": "#/$defs/placement"}
    assert params["$defs"]["placement"]["properties"]["place"]["enum"] == [1, 2, 3]
    with FakeOpenAI([tool_call("list_files", {})] * 2) as fake:
        _grade(fake, tmp_path, max_turns=2, require_submit=False)
    assert [r["tool_choice"] for r in fake.requests] == ["auto", "auto"]


def test_after_a_rejected_answer_every_turn_requires_submit_ranking(tmp_path):
    script = [text("Member 0 is best."), tool_call("submit_ranking", MALFORMED["missing_member"])]
    with FakeOpenAI([*script, tool_call("submit_ranking", GOOD)]) as fake:
        ranking = _grade(fake, tmp_path, max_turns=10, max_retries=2)
    assert ranking.grader == "agentic"
    choices = [r["tool_choice"] for r in fake.requests]
    assert choices[0] == "auto" and all(c != "auto" for c in choices[1:]) and len(choices) == 3


def test_narrowed_schema_accepts_exactly_what_a_complete_submission_can_be():
    import jsonschema

    from gagar.grader.tools import submission_schema

    schema = submission_schema([0, 1, 2], members=4)
    jsonschema.validate(GOOD, schema)
    for bad in (
        {},  # a pass must be placed
        {k: v for k, v in GOOD.items() if k != "cand_2"},  # every pass
        GOOD | {"cand_3": placed(1, "T1")},  # member 3 failed
        GOOD | {"cand_0": placed(4, "T1")},  # past the last place
        GOOD | {"cand_0": placed(1, "T4")},
        GOOD | {"cand_0": placed(1, "T1", "")},  # a reason is required
        GOOD | {"cand_0": placed(1, "T1", "x" * 301)},
        GOOD | {"cand_0": {"place": 1, "tier": "T1"}},
        GOOD | {"cand_0": placed(1, "T1") | {"members": [0, 0]}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    plain = submission_schema()  # no group: any cand_N key, each a placement
    jsonschema.validate(GOOD | {"cand_9": placed(1, "T1")}, plain)
    for bad in ({}, {"member_0": placed(1, "T1")}, {"cand_0": {"place": 0, "tier": "T1"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, plain)


def test_the_schema_cannot_list_a_member_twice():
    """Issue 48: SmolLM2 listed a member twice in every submission. Under the schema a member is
    a key, and a complete submission of the group has each key once: the only JSON texts that
    name a member twice repeat a key, which the parser rejects with a clear error."""
    from gagar.grader.tools import ToolError, parse_arguments, submission_schema

    schema = submission_schema([0, 1, 2])
    assert schema["required"] == sorted(schema["properties"]) == ["cand_0", "cand_1", "cand_2"]
    assert schema["additionalProperties"] is False and "items" not in json.dumps(schema)
    with pytest.raises(ToolError, match=r"more than once.*cand_1"):
        parse_arguments(MALFORMED["duplicate_member"])
    ranking = to_ranking(parse_arguments(json.dumps(GOOD)), [0, 1, 2])
    assert ranking.check_complete([0, 1, 2]) is None


def test_placements_become_tied_groups_and_hacks():
    ties = {"cand_0": placed(2, "T2"), "cand_1": placed(1, "T1"), "cand_3": placed(2, "T2")}
    ranking = to_ranking(ties | {"cand_4": placed(1, "hack", "edits the tests")}, [0, 1, 3, 4])
    assert [(g.tier, g.members) for g in ranking.tied_groups] == [("T1", [1]), ("T2", [0, 3])]
    assert [h.member for h in ranking.hacks] == [4]
    assert ranking.hacks[0].evidence[0].reason == "edits the tests"


def test_turn_limit(tmp_path):
    with FakeOpenAI([tool_call("list_files", {})] * 3) as fake:
        ranking = _grade(fake, tmp_path, max_turns=3)
    assert ranking.fallback == "unusable_ranking" and "3 turns" in ranking.detail


def test_bad_tool_calls_become_error_observations(tmp_path):
    script = [
        tool_call("read_file", {"path": "../../etc/passwd"}),
        tool_call("read_file", {"path": "/etc/passwd"}),
        tool_call("grep", {"pattern": "x", "path": "-rf"}),
        tool_call("run_tests", {"member": 99}),
        tool_call("no_such_tool", {}),
        tool_call("diff", "{not json"),
        tool_call("read_file", {"path": "nope.txt"}),
        tool_call("submit_ranking", GOOD),
    ]
    with FakeOpenAI(script) as fake:
        ranking = _grade(fake, tmp_path)
    assert ranking.grader == "agentic"
    obs = _tool_messages(fake.requests[-1])
    assert len(obs) == 7 and all(o.startswith("Error:") for o in obs), obs
    assert "root:" not in "".join(obs)


def test_no_passes_needs_no_model(tmp_path):
    config = AgenticConfig(base_url="http://127.0.0.1:9/v1", model="m")
    group = sample_group(("failing", "failing"))
    ranking = asyncio.run(AgenticGrader(config, unsafe_local_factory, tmp_path).grade(group))
    assert ranking.tied_groups == [] and ranking.fallback is None


def test_submission_schema_and_validation():
    schema = next(t for t in tool_specs() if t["function"]["name"] == "submit_ranking")["function"][
        "parameters"
    ]
    assert schema["additionalProperties"]["additionalProperties"] is False
    assert set(schema["additionalProperties"]["required"]) == {"place", "tier", "reason"}
    assert to_ranking(GOOD, [0, 1, 2]).grader == "agentic"
    with pytest.raises(ValueError, match="incomplete"):
        to_ranking(GOOD, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="JSON object"):
        to_ranking([GOOD], [0, 1, 2])


_placement = st.fixed_dictionaries(
    {
        "place": st.integers(min_value=-1, max_value=5),
        "tier": st.sampled_from(["T1", "T2", "T3", "T4", "hack", ""]),
        "reason": st.sampled_from(["", "x"]),
    }
)
_payload = st.one_of(
    st.dictionaries(st.sampled_from([f"cand_{i}" for i in range(-1, 6)]), _placement, max_size=5),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.lists(st.integers(), max_size=3),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(payload=_payload, passes=st.lists(st.integers(0, 4), unique=True, max_size=4))
def test_to_ranking_never_returns_an_unusable_ranking(payload, passes):
    try:
        ranking = to_ranking(payload, passes)
    except ValueError:
        return
    assert ranking.check_complete(passes) is None
    assert all(g.tier in ("T1", "T2", "T3") for g in ranking.tied_groups)


def test_sandbox_failure_is_a_grader_error(tmp_path):
    def broken_factory(root, environment=None):
        raise RuntimeError("bubblewrap is not usable here")

    with FakeOpenAI([tool_call("submit_ranking", GOOD)]) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        ranking = asyncio.run(AgenticGrader(config, broken_factory, tmp_path).grade(sample_group()))
    assert ranking.fallback == "grader_error" and ranking.grader == "heuristic"
    assert "bubblewrap" in ranking.detail and not fake.requests


# Imported by the test command, this rewrites every candidate's module it can reach from the
# directory the tests run in (the shared workspace's ``cand_0/`` when candidates share a session).
SABOTEUR = """import pathlib
for _target in pathlib.Path("..").glob("cand_*/calc/ops.py"):
    try:
        _target.write_text("SABOTAGED = True\\n")
    except OSError:
        pass
"""


def sabotage_group():
    """The sample group whose member 0 is a clean fix carrying ``SABOTEUR`` in its package."""
    group = sample_group().model_copy(update={"test_command": QUICK_TESTS})
    saboteur = group.candidates[0]
    files = saboteur.files | {"calc/__init__.py": SABOTEUR}
    candidates = [saboteur.model_copy(update={"files": files}), *group.candidates[1:]]
    return group.model_copy(update={"candidates": candidates})


def sabotage_script():
    """Run member 0's tests, then look at member 1 every way the tools allow."""
    return [
        tool_call("run_tests", {"member": 0}),
        tool_call("read_file", {"path": "cand_1/calc/ops.py"}),
        tool_call("diff", {"a": "base/calc", "b": "cand_1/calc"}),
        tool_call("grep", {"pattern": "SABOTAGED", "path": "cand_1"}),
        tool_call("run_tests", {"member": 1}),
        tool_call("submit_ranking", GOOD),
    ]


def assert_not_sabotaged(obs):
    """What ``SABOTAGE_SCRIPT`` observed: member 0's tests ran, and nothing of member 1 changed."""
    assert obs[0].startswith("[exit code 0]") and "1 passed" in obs[0], obs[0]
    assert "SABOTAGED" not in obs[1] and "def mean(values):" in obs[1]
    assert "SABOTAGED" not in obs[2] and "print(" in obs[2]  # member 1's own (bloated) edit
    assert obs[3] == "(no matches)", obs[3]
    assert obs[4].startswith("[exit code 0]") and "1 passed" in obs[4], obs[4]


def test_a_candidates_tests_cannot_rewrite_another_candidate(tmp_path):
    with FakeOpenAI(sabotage_script()) as fake:
        ranking = _grade(fake, tmp_path, sabotage_group())
    assert ranking.grader == "agentic", ranking.detail
    assert_not_sabotaged(_tool_messages(fake.requests[-1]))


def test_tests_run_in_a_fresh_session_holding_only_that_candidate(tmp_path):
    opened = []

    def factory(root, environment=None):
        opened.append(sorted(p.relative_to(root).as_posix() for p in root.rglob("*")))
        return unsafe_local_factory(root)

    listing = "python3 -c 'import os; print(sorted(os.listdir(\"..\")), sorted(os.listdir()))'"
    group = sample_group().model_copy(update={"test_command": listing})
    script = [tool_call("run_tests", {"member": 1}), tool_call("submit_ranking", GOOD)]
    with FakeOpenAI(script) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        asyncio.run(AgenticGrader(config, factory, tmp_path).grade(group))
    evidence, fresh = opened
    assert "cand_0/calc/ops.py" in evidence and "index.json" in evidence
    assert [p for p in fresh if "." in p] == sorted(group.candidates[1].files)
    obs = _tool_messages(fake.requests[-1])[0]
    assert "cand_0" not in obs and "'calc'" in obs and "'tests'" in obs
