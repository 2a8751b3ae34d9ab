"""`bench/gagar_vs_grpo.py` end to end at the smallest budget: one SFT start, both modes, one seed.

Slow (three `gagar train` processes, each with its own vLLM server): `make test-slow`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_comparison_runs_both_modes_from_one_start_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    # the tiny policy: the bookkeeping end to end in minutes (the default manifest's SmolLM2 takes
    # about half an hour for its SFT alone)
    cmd = [sys.executable, "bench/gagar_vs_grpo.py", "--manifest", "examples/local.yaml"]
    cmd += ["--seeds", "0", "--steps", "1"]
    cmd += ["--sft-steps", "2", "--eval-tasks", "2", "--dataset-size", "16"]
    cmd += ["--sft-experts", "16", "--copy-steps", "2"]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "GAGAR vs GRPO" in done.stdout
    result = json.loads(out.read_text())
    assert {r["mode"] for r in result["runs"]} == {"grpo", "gagar"}
    assert all(len(r["records"]) == 1 for r in result["runs"])
    assert result["sft"]["warm_start"]["sft_steps"] == 2
    for mode in ("grpo", "gagar"):
        assert set(result["summary"][mode]) >= {"resolution_rate", "gradient_variance"}
    # both RL runs started from the SFT run's published policy, not from a fresh preset
    for mode in ("grpo", "gagar"):
        run = json.loads((tmp_path / "work" / f"{mode}-s0" / "run.json").read_text())
        assert run["spec"]["model"]["path"].endswith("sft-policy")
        assert run["spec"]["model"]["sftWarmupSteps"] == 0
