"""The summary `gagar train` prints at the end: rows a person reads, never a raw dict."""

from __future__ import annotations

from gagar.driver.record import StepRecord
from gagar.driver.report import summary_rows
from tests.support.records import step_record


def _record(step: int, pass_rate: float, bloated: float | None = None, **flat) -> StepRecord:
    """16 trajectories; ``bloated``: the share of 2 graded passes (None: none graded)."""
    graded = 0 if bloated is None else 2
    return step_record(
        step,
        pass_rate=pass_rate,
        passes=round(pass_rate * 16),
        valid_trajectories=16,
        response_tokens_mean=100.0 + step,
        bloated_passes_ratio=bloated or 0.0,
        bloated_passes=round((bloated or 0.0) * graded),
        graded_passes=graded,
        **flat,
    )


REPORT = {
    "run": "local",
    "mode": "gagar",
    "policy_version": 20,
    "steps": 20,
    "warm_start": {
        "copy_curriculum": {"steps": 400, "nll_first": 8.37, "nll_last": 5.31},
        "sft_steps": 400,
        "sft_nll_first": 6.99,
        "sft_nll_last": 0.04,
    },
    "held_out": {"tasks": 16, "valid": 16, "resolution_rate": 0.125, "response_tokens_mean": 120.4},
}


def test_rows_show_the_trend_the_warm_start_and_the_held_out_score() -> None:
    records = [
        _record(i, 0.1 if i <= 5 else 0.5, bloated=0.5 if i % 2 else None) for i in range(1, 21)
    ]
    rows = dict(summary_rows(REPORT, records))
    rate = rows["training pass rate (first 5 → last 5 steps)"]
    assert rate.startswith("10/80 = 0.12 [0.06, 0.22] → 40/80 = 0.50 [0.39, 0.61]"), rate
    assert rows["copy curriculum"] == "400 steps, NLL/token 8.37 → 5.31"
    assert rows["SFT warm start"] == "400 steps, NLL/token 6.99 → 0.04"
    assert rows["held-out resolved"] == "2/16 = 0.12 [0.02, 0.38]"
    # steps without a bloat measurement add no graded pass, not a 0
    assert rows["bloated share of passes"].startswith("3/6 = 0.50 [0.12, 0.88] → 2/4 = 0.50")
    assert not any("{" in v for v in rows.values())


def test_a_short_run_and_a_run_without_evaluation() -> None:
    report = {**REPORT, "warm_start": {}, "held_out": {}, "steps": 1}
    rows = dict(summary_rows(report, [_record(1, 0.25)]))
    assert rows["training pass rate (first 1 → last 1 steps)"] == "4/16 = 0.25 [0.07, 0.52]"
    assert rows["bloated share of passes"] == "–"
    assert "held-out resolved" not in rows and "SFT warm start" not in rows


def test_the_probe_set_start_and_end_are_a_row() -> None:
    probe = {
        "start": {"valid": 64, "pass_rate": 0.125},
        "end": {"valid": 64, "pass_rate": 0.3125},
    }
    rows = dict(summary_rows({**REPORT, "probe": probe}, [_record(1, 0.25)]))
    assert rows["probe pass rate (start → end)"] == "0.12 → 0.31 (64 samples)"
    assert max(len(name) for name in rows) <= 45  # with its values, the table fits 80 columns
    assert not any(k.startswith("probe") for k in dict(summary_rows(REPORT, [])))


def test_a_cached_warm_start_says_so() -> None:
    report = {**REPORT, "warm_start": {**REPORT["warm_start"], "cached": True}}
    rows = dict(summary_rows(report, []))
    assert rows["SFT warm start (cached on this machine)"] == "400 steps, NLL/token 6.99 → 0.04"


def _counted(step: int, passes: int, bloated: int, graded: int) -> StepRecord:
    return step_record(
        step,
        pass_rate=passes / 16,
        passes=passes,
        valid_trajectories=16,
        bloated_passes_ratio=bloated / graded if graded else 0.0,
        bloated_passes=bloated,
        graded_passes=graded,
    )


def test_small_numbers_are_pooled_counts_with_intervals_and_a_verdict() -> None:
    # the run that printed "bloated share 0.23 → 0.67": means of per-step ratios over 3-4 passes,
    # several steps counting one bloated pass of one as 1.0
    records = [_counted(i, 3, 1, 3) for i in range(1, 6)]  # 5 of 15 bloated
    records += [_counted(i, 3, [1, 1, 0, 3, 1][i - 6], 3) for i in range(6, 11)]
    rows = dict(summary_rows(REPORT, records))
    bloat = rows["bloated share of passes"]
    assert bloat.startswith("5/15 = 0.33 [0.12, 0.62] → 6/15 = 0.40 [0.16, 0.68]")
    assert "within noise" in bloat
    many = [_counted(i, 2, 0, 2) for i in range(1, 6)] + [
        _counted(i, 14, 0, 2) for i in range(6, 11)
    ]
    rate = dict(summary_rows(REPORT, many))["training pass rate (first 5 → last 5 steps)"]
    assert rate.startswith("10/80 = 0.12") and "within noise" not in rate and "p = " in rate


def test_the_probe_change_counts_the_samples_that_moved() -> None:
    def ev(passed: list[bool]) -> dict:
        samples = [{"valid": True, "passed": p} for p in passed]
        return {"valid": len(passed), "pass_rate": sum(passed) / len(passed), "samples": samples}

    start = [i < 16 for i in range(64)]
    end = [i < 20 for i in range(64)]  # 4 gained, none lost: p = 2/16
    rows = dict(summary_rows({**REPORT, "probe": {"start": ev(start), "end": ev(end)}}, []))
    text = rows["probe pass rate (start → end)"]
    assert text.startswith("16/64 = 0.25 [0.15, 0.37] → 20/64 = 0.31 [0.20, 0.44]")
    assert "4 gained, 0 lost (within noise, p = 0.12)" in text


def test_the_noise_scale_is_pooled_over_steps_before_dividing() -> None:
    from gagar.driver.report import pooled_noise_scale

    records = [
        _record(1, 0.2, gradient_noise_trace=10.0, gradient_signal_sq=-0.5),  # one noisy step
        _record(2, 0.3, gradient_noise_trace=30.0, gradient_signal_sq=1.5),
        _record(3, 0.3),
    ]
    assert pooled_noise_scale(records) == 40.0 / 1.0  # not the mean of per-step ratios
    rows = dict(summary_rows(REPORT, records))
    assert rows["gradient noise scale, tokens"] == "40 (tr Σ and ‖G‖² pooled over 2 steps)"
    records[1].learner.gradient_signal_sq = 0.25
    assert pooled_noise_scale(records) is None
    assert "undefined" in dict(summary_rows(REPORT, records))["gradient noise scale, tokens"]


def test_mined_held_out_tasks_are_resolved_per_package() -> None:
    """The held-out split of mined tasks is whole packages: each gets its row, its share and
    interval, among valid rollouts only; tasks of no package (synthetic) get none."""

    def sample(pkg: str | None, passed: bool, valid: bool = True) -> dict[str, object]:
        return {"package": pkg, "passed": passed, "valid": valid}

    samples = [sample("toolz", True), sample("toolz", False), sample("toolz", True, valid=False),
               sample("parse", False), sample(None, True)]  # fmt: skip
    held = {**REPORT["held_out"], "samples": samples}
    rows = summary_rows({**REPORT, "held_out": held}, [])
    names = [name for name, _ in rows]
    at = names.index("held-out resolved")
    assert rows[at + 1 : at + 3] == [
        ("  parse", "0/1 = 0.00 [0.00, 0.97]"),
        ("  toolz", "1/2 = 0.50 [0.01, 0.99]"),
    ]
    assert names[at + 3] == "held-out response tokens"


def test_the_graders_usable_rate_graders_and_fallbacks_are_rows() -> None:
    """An agentic grader's run shows how many groups it ranked itself (issue 48: the summary
    shows the grader's usable rate), who ranked the rest and why it fell back."""
    agentic = {"graded_by": {"agentic": 2}, "usable_groups": 2}
    fell = {
        "graded_by": {"agentic": 1, "heuristic": 1},
        "fallbacks": {"heuristic_after_unusable_ranking": 1},
        "usable_groups": 1,
        "heuristic_pairs": 6,
        "heuristic_agreeing_pairs": 3,
    }
    records = [_record(1, 0.5, **agentic), _record(2, 0.5, **fell)]
    rows = dict(summary_rows(REPORT, records))
    assert rows["grader rankings usable"] == "3/4 = 0.75 [0.19, 0.99]"
    assert (
        rows["  graded by · fallbacks"]
        == "agentic 3, heuristic 1 · heuristic_after_unusable_ranking 1"
    )
    assert rows["  pairs ordered as the heuristic"] == "3/6 = 0.50 [0.12, 0.88]"
    assert max(len(name) for name in rows) <= 45


def test_a_run_whose_groups_had_nothing_to_rank_has_no_grader_rows() -> None:
    rows = dict(summary_rows(REPORT, [_record(1, 0.0)]))
    assert not any(name.lstrip().startswith(("grader", "graded", "pairs")) for name in rows)
