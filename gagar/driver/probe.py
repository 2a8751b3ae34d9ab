"""The probe set: fixed in-distribution samples scored at the start and at the end of a run.

The held-out tasks say whether the policy generalizes; the tiny policy of the embedded default
resolves none of them, so they cannot show it learning. The probe set is drawn from the
*training* tasks (the distribution RL optimizes): the first ``ceil(samples / per_task)`` training
tasks with a reference fix, each sampled ``per_task`` times, every sample with a fixed seed, the
same at the start and the end of the run (and in every run of a comparison with the same dataset).
It only measures: nothing is tuned on it. ``gagar train --probe N`` turns it on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gagar.rollout.envs.task import Task

PER_TASK = 4  # samples per probe task: 64 samples are 16 tasks x 4 seeds
PROBE_SEED = 500_000  # sampling seeds of the probe, far from the held-out evaluation's


def probe_tasks(train_tasks: list[Task], samples: int, per_task: int = PER_TASK) -> list[Task]:
    """``samples`` tasks to roll out once each: ``per_task`` consecutive copies of each task."""
    if samples <= 0:
        return []
    usable = [t for t in train_tasks if t.reference_files] or list(train_tasks)
    need = -(-samples // per_task)
    chosen = usable[:need]
    if not chosen:
        raise ValueError("no training task to probe")
    return [chosen[i // per_task % len(chosen)] for i in range(samples)]


def summary(evaluation: dict[str, Any]) -> dict[str, Any]:
    """Pass rate, and tokens/turns per passing sample, of one probe evaluation."""
    samples = evaluation.get("samples", [])
    passes = [s for s in samples if s["valid"] and s["passed"]]
    return {
        **{k: v for k, v in evaluation.items() if k != "samples"},
        "pass_rate": evaluation.get("resolution_rate", 0.0),
        "passes": len(passes),
        "tokens_per_pass": sum(s["tokens"] for s in passes) / len(passes) if passes else None,
        "turns_per_pass": sum(s["turns"] for s in passes) / len(passes) if passes else None,
        "samples": samples,
    }


def load_start(out: Path) -> dict[str, Any] | None:
    path = out / "probe_start.json"
    return json.loads(path.read_text()) if path.exists() else None


def save_start(out: Path, result: dict[str, Any]) -> None:
    """The start's score is kept beside the checkpoints: a resumed run does not re-score it on
    weights that have already moved."""
    (out / "probe_start.json").write_text(json.dumps(result))
