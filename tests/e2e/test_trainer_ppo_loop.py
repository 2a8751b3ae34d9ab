"""The real loop with mini-batches, a KL reference and LR warm-up, end to end.

The smallest configuration that runs the real loop: the cluster trainer's command on two ranks
(data parallelism 2) against the in-test services of ``test_cluster_trainer`` (bubblewrap
sandboxes, the heuristic grader service, a scripted policy on the fake vLLM server), with
``miniBatches: 2``, ``kl.coef: 0.05`` and ``warmupSteps: 2``. Two steps, then a restarted Job
resumes for a third: ``metrics.jsonl`` must show the warm-up's rising learning rate continued
exactly after the resume, KL > 0 after the first update, importance ratios off 1, and a measured
``checkpoint_seconds`` on checkpoint steps; every checkpoint holds each rank's reference, which
stays the start policy across the resume.
"""

from __future__ import annotations

import json

import pytest
import torch

from gagar.spec import GagarRun
from tests.e2e.test_cluster_trainer import launch, services, spec

pytestmark = pytest.mark.e2e
__all__ = ["services"]  # the module-scoped fixture, shared

LR = 1.0e-3


def ppo_spec(steps: int) -> GagarRun:
    doc = spec(steps).to_wire()
    alg = doc["spec"]["algorithm"]
    alg["miniBatches"] = 2
    alg["loss"] = {"kl": {"coef": 0.05, "estimator": "k3"}}
    alg["optimizer"] = {"lr": LR, "warmupSteps": 2}
    doc["spec"]["trainer"]["checkpoint"]["intervalSteps"] = 2
    return GagarRun.model_validate(doc)


def test_mini_batches_kl_and_warmup_train_and_resume(services, tmp_path) -> None:
    run_dir = services["run_dir"]  # the scripted policy reads the tokenizer of its policy/base
    env = {
        "GAGAR_RUN_DIR": str(run_dir),
        "GAGAR_CHECKPOINT_URI": "pvc://cluster-test-checkpoints",
        "GAGAR_ROLLOUT_URL": services["rollout"].base_url,
        "GAGAR_GRADER_URL": services["grader"].url,
        "GAGAR_SANDBOX_URL": services["sandbox"],
        "GAGAR_WEIGHT_TRANSPORT": "gagar-cpu",
        "GAGAR_METRICS_PORT": "0",
    }
    code, out = launch(ppo_spec(2), tmp_path, env, timeout=400)
    assert code == 0, out[-6000:]
    code, out = launch(ppo_spec(3), tmp_path, env, timeout=400)  # a restarted Job
    assert code == 0, out[-6000:]
    assert "resumed from the checkpoint of step 2" in out

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["lr"] for r in records] == pytest.approx([LR / 2, LR, LR])  # warm-up, then peak
    assert all(r["optimizer_steps"] == 2 and r["trained_groups"] == 2 for r in records)
    assert all(r["kl"] > 0 for r in records)  # the second mini-batch already moved off the start
    assert all(r["ratio_max"] != 1.0 and r["ratio_mean"] != 1.0 for r in records)
    clips = ("clip_low_ratio", "clip_high_ratio", "clip_dual_ratio", "clip_ratio")
    assert all(records[0][k] is not None for k in clips)
    assert records[0]["checkpoint_seconds"] == 0.0  # no checkpoint at step 1
    assert records[1]["checkpoint_seconds"] > 0 and records[2]["checkpoint_seconds"] > 0
    assert all(r["gradient_variance_scaled"] is not None for r in records)
    # the noise scale's units are whole groups (issue 50): each mini-batch here holds one group,
    # one unit, so no optimizer step can estimate tr Σ or ‖G‖² and no record has their parts
    parts = ("gradient_noise_trace", "gradient_signal_sq")
    assert all(r.get(k) is None for k in parts for r in records)

    from gagar.trainer.sharded import read_tensors

    saved = {s: read_tensors(run_dir / "checkpoints" / f"step_{s:08d}") for s in (2, 3)}
    refs = {s: {k: v for k, v in t.items() if k.startswith("reference.")} for s, t in saved.items()}
    assert refs[2] and refs[2].keys() == refs[3].keys()
    for key, tensor in refs[2].items():  # the resumed run kept the start policy as its reference
        assert torch.equal(tensor, refs[3][key])
    model = saved[3]
    kept = [k for k, r in refs[3].items() if torch.equal(model[k.removeprefix("reference.")], r)]
    assert len(kept) < len(refs[3]) // 2, "the policy moved away from its reference"
