"""The agentic grader's tools inside a real ``gagar.sandbox`` bubblewrap session (skipped when
the sandbox package or bubblewrap is unavailable)."""

from __future__ import annotations

import asyncio

import pytest

from gagar.grader.agentic import AgenticConfig, AgenticGrader
from gagar.grader.sample import sample_group
from gagar.grader.sandbox_adapter import adapt_factory
from tests.support.fake_openai import FakeOpenAI, tool_call
from tests.unit.test_grader_agentic import assert_not_sabotaged, sabotage_group, sabotage_script

local = pytest.importorskip("gagar.sandbox.local")
types = pytest.importorskip("gagar.sandbox.types")

GOOD = {
    "cand_0": {"place": 1, "tier": "T1", "reason": "minimal"},
    "cand_1": {"place": 2, "tier": "T2", "reason": "debug output"},
    "cand_2": {"place": 3, "tier": "hack", "reason": "test edit"},
}


def test_tools_run_in_a_bubblewrap_session(tmp_path):
    try:
        factory = local.LocalFactory()
    except types.SandboxUnavailable as err:
        pytest.skip(f"bubblewrap unavailable: {err}")
    quick = "python3 -c 'from calc.ops import mean; assert mean([1, 2, 3]) == 2; print(\"ok\")'"
    group = sample_group().model_copy(update={"test_command": quick})
    script = [
        tool_call("run_tests", {"member": 0}),
        tool_call("run_tests", {"member": 3}),
        tool_call("read_file", {"path": "missing.txt"}),
        tool_call("diff", {"a": "base", "b": "cand_0"}),
        tool_call("submit_ranking", GOOD),
    ]
    with FakeOpenAI(script) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        grader = AgenticGrader(config, adapt_factory(factory, (types.SandboxError,)), tmp_path)
        ranking = asyncio.run(grader.grade(group))
    assert ranking.grader == "agentic", ranking.detail
    obs = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert obs[0].startswith("[exit code 0]") and "ok" in obs[0]
    assert obs[1].startswith("[exit code 1]") and "AssertionError" in obs[1]
    assert obs[2].startswith("Error:")
    assert "+    return total / len(values)" in obs[3]


def test_a_candidates_tests_cannot_rewrite_another_candidate_in_bubblewrap(tmp_path):
    try:
        factory = local.LocalFactory()
    except types.SandboxUnavailable as err:
        pytest.skip(f"bubblewrap unavailable: {err}")
    with FakeOpenAI(sabotage_script()) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        grader = AgenticGrader(config, adapt_factory(factory, (types.SandboxError,)), tmp_path)
        ranking = asyncio.run(grader.grade(sabotage_group()))
    assert ranking.grader == "agentic", ranking.detail
    assert_not_sabotaged(
        [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    )


def test_final_files_of_a_real_session_are_read_within_bounds():
    """What the code leaves in a bubblewrap session (a link out, a FIFO, a name no repository may
    hold, a file past the size bound) is skipped and reported when the driver reads the final
    repository for the grader, never raised."""
    from gagar.driver.rollouts import _text_files
    from gagar.grader.bounds import MARKER_PREFIX
    from gagar.grader.sample import BASE

    try:
        factory = local.LocalFactory()
    except types.SandboxUnavailable as err:
        pytest.skip(f"bubblewrap unavailable: {err}")
    session = factory.create(files={k: v.encode() for k, v in BASE.items()})
    try:
        script = (
            "ln -s /etc/passwd passwd && mkfifo fifo && printf x > '..odd.py' && "
            "head -c 2000000 /dev/zero | tr '\\0' x > big.py"
        )
        assert session.exec(["sh", "-c", script], timeout=30).exit_code == 0
        files, skipped = _text_files(session, BASE)
    finally:
        session.close()
    assert files["calc/ops.py"] == BASE["calc/ops.py"]
    assert files["big.py"].startswith(MARKER_PREFIX)
    reasons = {s.path: s.reason for s in skipped}
    assert reasons["..odd.py"] == "unsafe_path" and reasons["big.py"] == "file_too_large"
    assert reasons["passwd"] == "unreadable" and reasons["fifo"] == "unreadable"
