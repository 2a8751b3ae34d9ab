"""bench/rollout.py's summary of repeated loop/replay pairs (``--repeats``)."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_rollout", ROOT / "bench" / "rollout.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _pair(c: int, repeat: int, ratio: float, engine: float) -> dict:
    return {
        "concurrency": c,
        "repeat": repeat,
        "ratio": ratio,
        "engine_cpu_per_token_ratio": engine,
        "loop": {"trajectories": 0, "cpu_s": {"sandboxes": 0.0}},
    }


def test_the_summary_is_per_concurrency_over_its_pairs() -> None:
    results = [
        _pair(32, 0, 0.72, 1.10),
        _pair(8, 0, 0.90, 1.00),
        _pair(32, 1, 0.63, 1.22),
        _pair(32, 2, 0.75, 1.05),
    ]
    summary = bench.summarize(results)
    assert summary["32"] == {
        "repeats": 3,
        "ratio_median": 0.72,
        "ratio_min": 0.63,
        "ratio_max": 0.75,
        "ratio_mean_ci95": summary["32"]["ratio_mean_ci95"],
        "ratios": [0.72, 0.63, 0.75],  # in the order measured
        "engine_cpu_per_token_ratio_median": 1.10,
        "engine_cpu_per_token_ratio_max": 1.22,
    }
    ci = summary["32"]["ratio_mean_ci95"]  # bench/stats.py's Student-t interval over the pairs
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(0.70)
    assert ci["low"] < 0.63 < 0.75 < ci["high"]
    assert summary["8"]["repeats"] == 1 and summary["8"]["ratio_median"] == 0.90


def test_repeated_pairs_are_labelled_and_summarized_in_the_notes() -> None:
    results = [_pair(32, 0, 0.70, 1.1), _pair(32, 1, 0.74, 1.1)]
    res = {
        "results": results,
        "summary": bench.summarize(results),
        "vllm_startup_s": 20.0,
        "load_average": [1.0, 1.0, 1.0],
    }
    out = io.StringIO()
    bench._notes(Console(file=out, width=200), res)
    text = out.getvalue()
    assert "C = 32: " in text and "C = 32 #2: " in text
    assert "C = 32, 2 pairs: loop/raw median 0.72x (range 0.70-0.74x)" in text
