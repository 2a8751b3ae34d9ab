"""``bench/e2e_protocol.py --smoke --device cpu``: the GPU protocol's pipeline end to end on the
tiny policy (1 warm start × 1 seed × 2 arms × 1 step, a 4-task held-out set): three `gagar train`
processes, each with its own vLLM server: 2,016 s on the loaded 2-core machine (load 20-90),
hence slow (`make test-all`). Its numbers answer nothing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_cpu_smoke_of_the_e2e_protocol_runs_every_stage(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "bench/e2e_protocol.py",
        "--smoke",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--work",
        str(tmp_path / "work"),
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [(r["kind"], r.get("arm")) for r in runs] == [
        ("warm_start", None),
        ("rl", "grpo"),
        ("eval", "grpo"),  # the smoke's second sample per task: an eval-only pass
        ("rl", "gagar"),
        ("eval", "gagar"),
    ]
    split = result["protocol"]["split"]
    for r in runs:
        o = r["outcomes"]
        held = json.loads((Path(r["out"]) / "report.json").read_text())["held_out"]
        assert held["tasks"] == result["protocol"]["held_out"]["evaluated"]
        # scored: the valid held-out samples, less those whose task a training task repeats
        kept = [x for x in held["samples"] if x["valid"] and x["task"] not in split["excluded"]]
        assert o["scored"] == len(kept) >= 1
        assert o["resolution"] == sum(x["passed"] for x in kept) / len(kept)
    for r in (r for r in runs if r["kind"] == "rl"):
        assert len((Path(r["out"]) / "metrics.jsonl").read_text().splitlines()) == 1
        assert math.isfinite(r["outcomes"]["step_seconds"])
    assert result["per_warm_start"]["0"].keys() == {"grpo", "gagar"}
    # the manipulation check, stated in advance, is measured in the smoke: 2 pairs of arms
    check = result["manipulation_check"]
    assert check["threshold"] == 0.10 and len(check["pairs"]) == 2
    assert 0 <= check["value"] <= 1
    primary = result["tests"][result["protocol"]["primary"]["outcome"]]
    assert primary["n"] == 1 and primary["primary"] is True  # one warm start: no test possible
