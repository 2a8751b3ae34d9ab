"""`bench/gagar_vs_grpo.py --quick` end to end: one warm start, the four arms, one seed, the probe.

Slow (five `gagar train` processes, each with its own vLLM server): `make test-all`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# five `gagar train` processes: beyond the suite's 15-minute default on a loaded 2-core machine
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_quick_comparison_runs_every_arm_from_one_start_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "bench/gagar_vs_grpo.py", "--quick"]
    cmd += ["--work", str(tmp_path / "work"), "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) >= {"protocol", "arms", "tests", "replay"}
    assert result["protocol"]["quick"] is True and result["protocol"]["probe_samples"] == 4
    assert set(result["arms"]) == {"grpo", "gagar", "gagar-redistribution", "gagar-shaping"}
    for arm, runs in result["arms"].items():
        assert [r["seed"] for r in runs] == [0], arm
        assert len(runs[0]["steps"]["pass_rate"]) == 2
        probe = runs[0]["probe"]
        assert probe["start"]["tasks"] == probe["end"]["tasks"] == 4
    for arm in result["arms"]:
        run = json.loads((tmp_path / "work" / f"{arm}-s0" / "run.json").read_text())
        assert run["spec"]["model"]["path"].endswith("sft-policy")
        assert run["spec"]["algorithm"]["dynamicSampling"]["enabled"] is False
    assert run["spec"]["algorithm"]["redistribution"]["qualityFactors"]["t3"] == 1.0
    assert set(result["tests"]) >= {"pass_rate_area", "probe_end_per_sample"}
    assert (tmp_path / "result" / "pass_rate.png").stat().st_size > 0
    assert "| training pass rate" in (tmp_path / "result.md").read_text()
