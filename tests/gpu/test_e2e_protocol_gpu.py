"""``bench/e2e_protocol.py --smoke`` on a GPU: the protocol's pipeline on the pretrained policy,
1 warm start × 1 seed × 2 arms × 2 RL steps, with its measured step time (what replaces the
protocol's assumed one in ``estimate``).

Not run where there is no GPU (the conftest skips ``gpu`` tests), nor without the policy on disk:
``GAGAR_E2E_POLICY`` names the Hugging Face folder of Qwen2.5-0.5B-Instruct (the GPU machines
reach no network). On a lent accelerator:
``GAGAR_E2E_POLICY=/models/Qwen2.5-0.5B-Instruct python -m pytest tests/gpu/test_e2e_protocol_gpu.py -m gpu -s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(3600)]


def test_two_step_smoke_of_the_e2e_protocol_on_the_pretrained_policy(tmp_path: Path) -> None:
    policy = os.environ.get("GAGAR_E2E_POLICY")
    if not policy or not (Path(policy) / "config.json").is_file():
        pytest.skip("GAGAR_E2E_POLICY does not name an HF folder of the protocol's policy")
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "bench/e2e_protocol.py",
        "--smoke",
        "--policy",
        policy,
        "--device",
        "cuda",
        "--steps",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["protocol"]["policy"]["parameters"] >= 4.9e8
    runs = result["runs"]
    assert [r["kind"] for r in runs] == ["warm_start", "rl", "eval", "rl", "eval"]
    assert {r["arm"] for r in runs[1:]} == {"grpo", "gagar"}
    for r in runs:
        assert r["outcomes"]["scored"] >= 1, r
    for r in (r for r in runs if r["kind"] == "rl"):
        metrics = (
            (tmp_path / "work" / Path(r["out"]).name / "metrics.jsonl").read_text().splitlines()
        )
        assert len(metrics) == 2
        print(
            f"\n{r['arm']}: step_seconds {r['outcomes']['step_seconds']:.1f} "
            f"(the protocol assumes {result['protocol']['estimate']['assumed_step_seconds']})"
        )
    assert set(result["tests"]) == set(result["protocol"]["outcomes"])
    check = result["manipulation_check"]  # measured on the GPU: do the arms diverge?
    print(f"manipulation check: {check['value']:.2f} (threshold {check['threshold']})")
    assert len(check["pairs"]) == 2
