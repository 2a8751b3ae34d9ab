"""gagar's vLLM plugins for waiting without spinning and per-step statistics, without vLLM
(the real engine: tests/e2e/test_vllm_idle_wait.py)."""

from __future__ import annotations

import pytest

from gagar.rollout.engines.vllm_idle_wait import (
    ENV,
    RECHECK_ENV,
    busy_loop_seconds,
    recheck_ms,
    settings,
)
from gagar.rollout.engines.vllm_step_stats import Step, read_steps, step_of


def test_the_spin_is_read_from_its_variable():
    assert busy_loop_seconds({}) is None
    assert busy_loop_seconds({ENV: "0"}) == 0.0
    assert busy_loop_seconds({ENV: " 0.25 "}) == 0.25


@pytest.mark.parametrize("bad", ["-1", "nan", "soon", "1s"])
def test_a_bad_spin_is_refused_naming_the_variable(bad):
    with pytest.raises(ValueError, match=ENV):
        busy_loop_seconds({ENV: bad})


@pytest.mark.parametrize("bad", ["0", "-5", "2.5", "soon"])
def test_a_bad_recheck_is_refused_naming_the_variable(bad):
    with pytest.raises(ValueError, match=RECHECK_ENV):
        recheck_ms({RECHECK_ENV: bad})


def test_on_the_cpu_no_spin_and_a_5_ms_recheck_unless_set_elsewhere_vllms_own():
    assert settings({}, cpu=True) == (0.0, 5)
    assert settings({}, cpu=False) == (None, None)  # a GPU host keeps vLLM's spin and re-check
    assert settings({ENV: "1"}, cpu=True) == (1.0, 5)  # vLLM's spin back, on the CPU
    assert settings({RECHECK_ENV: "50"}, cpu=True) == (0.0, 50)
    assert settings({ENV: "0", RECHECK_ENV: "5"}, cpu=False) == (0.0, 5)


def test_a_step_counts_prefill_tokens_apart_from_decodes():
    step = step_of(running=5, waiting=2, scheduled={"a": 1, "b": 1, "c": 300, "d": 1}, t=3.5)
    assert (step.seqs, step.tokens, step.prefill_tokens, step.decode_tokens) == (4, 303, 300, 3)
    assert Step.parse(step.line()) == step


def test_reading_steps_leaves_a_partial_line_for_the_next_read(tmp_path):
    path = tmp_path / "steps.log"
    assert read_steps(path) == ([], 0)  # no step yet: no file
    one, two = Step(1.0, 2, 0, 2, 2, 0), Step(2.0, 3, 1, 3, 40, 38)
    path.write_text(one.line() + two.line()[:7])
    steps, offset = read_steps(path)
    assert steps == [one] and offset == len(one.line())
    path.write_text(one.line() + two.line())
    assert read_steps(path, offset) == ([two], len(one.line() + two.line()))
    with pytest.raises(ValueError, match="not a step line"):
        Step.parse("1.0 2 3")
