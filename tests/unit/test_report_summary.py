"""The summary `gagar train` prints at the end: rows a person reads, never a raw dict."""

from __future__ import annotations

from gagar.driver.report import summary_rows


def _record(step: int, pass_rate: float, bloated: float | None = None) -> dict:
    rec = {"step": step, "pass_rate": pass_rate, "response_tokens_mean": 100.0 + step}
    rec["step_seconds"] = 10.0
    if bloated is not None:
        rec["bloated_passes_ratio"] = bloated
    return rec


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
    assert rows["training pass rate (first 5 → last 5 steps)"] == "0.10 → 0.50"
    assert rows["copy curriculum"] == "400 steps, NLL/token 8.37 → 5.31"
    assert rows["SFT warm start"] == "400 steps, NLL/token 6.99 → 0.04"
    assert rows["held-out resolved"] == "2/16 (12%)"
    # steps without a bloat measurement are skipped, not counted as 0
    assert rows["bloated share of passes"] == "0.50 → 0.50"
    assert not any("{" in v for v in rows.values())


def test_a_short_run_and_a_run_without_evaluation() -> None:
    report = {**REPORT, "warm_start": {}, "held_out": {}, "steps": 1}
    rows = dict(summary_rows(report, [_record(1, 0.25)]))
    assert rows["training pass rate (first 1 → last 1 steps)"] == "0.25"
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
