"""Scripted experts run through the real agent loop, tools and bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gagar.driver.rollouts import RolloutConfig, Rollouts
from gagar.driver.sft import ScriptedExpert, expert_turns, reference_fix
from gagar.rollout.agent import AgentLimits
from gagar.rollout.envs import synthetic
from gagar.sandbox import Limits
from gagar.sandbox.local import LocalFactory


@pytest.fixture(scope="module")
def fmt_and_eos():
    from gagar.rollout.chat import HFChatFormat
    from gagar.trainer.model.presets import fast_tokenizer

    fast = fast_tokenizer(["def f(x):\n    return x + 1\n"] * 10, vocab_size=512)  # the presets'
    return HFChatFormat(fast), fast.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize(
    ("style", "passes"), [("clean", True), ("bloated", True), ("redundant", True), ("wrong", False)]
)
def test_expert_styles(fmt_and_eos, style: str, passes: bool, tmp_path: Path) -> None:
    fmt, eos = fmt_and_eos
    task = synthetic.generate(3)
    cfg = RolloutConfig(AgentLimits(8, 512, 8192), 20, 30)
    engine = ScriptedExpert(expert_turns(task, style), fmt.encode, eos)  # type: ignore[arg-type]
    rollouts = Rollouts(LocalFactory(Limits(wall_time_s=20)), engine, fmt, cfg)
    rollout, files = asyncio.run(rollouts.one(task, None))
    traj = rollout.trajectory
    assert rollout.valid and traj.exit_reason == "submitted"
    assert rollout.passed is passes
    if style == "redundant":
        assert traj.flag_counts()["redundant"] == 2
    if style == "bloated":
        assert any(p.endswith("debug_helpers.py") for p in files)
    if style == "clean":
        fix = reference_fix(task)
        assert fix.path in rollout.patch and traj.flag_counts() == {
            "redundant": 0,
            "tool_error": 0,
            "churn": 0,
        }


def test_the_spec_style_mix_decides_which_experts_run(fmt_and_eos) -> None:
    """``spec.model.sftExpertStyles``: a mix of only bloated and wrong experts yields exactly
    those, bloated ones passing with their debugging module, wrong ones failing."""
    from gagar.driver.sft import expert_trajectories
    from gagar.spec import ExpertStyles

    fmt, eos = fmt_and_eos
    tasks = [synthetic.generate(s) for s in range(6)]
    cfg = RolloutConfig(AgentLimits(8, 512, 8192), 20, 30)
    styles = ExpertStyles(clean=0, bloated=1, redundant=0, wrong=1)
    out = asyncio.run(
        expert_trajectories(
            tasks, LocalFactory(Limits(wall_time_s=20)), fmt, eos, cfg, seed=3, styles=styles
        )
    )
    assert {s for s, _, _ in out} == {"bloated", "wrong"}
    assert all(passed == (style == "bloated") for style, _, passed in out)
