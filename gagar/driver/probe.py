"""The probe set: fixed in-distribution samples scored at the start and at the end of a run.

The held-out tasks say whether the policy generalizes; the tiny policy of the embedded default
resolves none of them, so they cannot show it learning. The probe set is drawn from the
*training* tasks (the distribution RL optimizes): the first ``ceil(samples / per_task)`` training
tasks with a reference fix, each sampled ``per_task`` times, every sample with a fixed seed, the
same at the start and the end of the run (and in every run of a comparison with the same dataset).
It only measures: nothing is tuned on it. ``gagar train --probe N`` turns it on.

The start's score is a function of the starting weights, the probe's tasks and seeds, and the
agent, sandbox and grader settings. ``gagar train`` keeps it per machine beside the warm-start
cache, keyed by a digest of the published weights and those settings: a second run of the same
manifest, or every arm of a comparison that starts from one policy, reuses it instead of rolling
the same samples out again (the trajectories come with it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from gagar.driver import sft
from gagar.rollout.envs.task import Task

PER_TASK = 4  # samples per probe task: 64 samples are 16 tasks x 4 seeds
PROBE_SEED = 500_000  # sampling seeds of the probe, far from the held-out evaluation's
CACHE_KEEP = 64  # newest start scores kept per machine (a few hundred KB each)
# the code a start score depends on: the warm start's, and the grader that flags bloated passes
KEY_CODE = (*sft.KEY_CODE, "grader", "wire.py")


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


# ---------------------------------------------------------------- the start score's cache
def weights_digest(weights: Path) -> str:
    """sha256 over the names and bytes of the files of a published policy folder."""
    h = hashlib.sha256()
    for path in sorted(p for p in weights.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def start_key(run: Any, weights: Path, samples: int) -> str:
    """Everything the start's score depends on: the weights, the tasks (the dataset), the probe's
    size and seeds, the agent's limits and sampling, the sandbox and the grader, the code. Not the
    algorithm (mode, seed, advantages) nor the trainer: they act only once the run trains."""
    s = run.spec
    dump = lambda m: m.model_dump(mode="json", by_alias=True, exclude_none=True)  # noqa: E731
    parts = {
        "weights": weights_digest(weights),
        "samples": samples,
        "per_task": PER_TASK,
        "seed": PROBE_SEED,
        "dataset": dump(s.dataset),
        "agent": dump(s.rollout.agent),
        "sandbox": dump(s.sandbox),
        "grader": dump(s.grader),
        "code": sft.code_hash(parts=KEY_CODE),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def cache_root() -> Path:
    """``$GAGAR_CACHE_DIR/probe-start`` (default ``~/.cache/gagar/probe-start``)."""
    return sft.cache_root().parent / "probe-start"


def cached_start(key: str, rollouts: Path) -> dict[str, Any] | None:
    """The start score kept under ``key`` (its trajectories copied to ``rollouts``), or None."""
    entry = cache_root() / key
    if not (entry / "summary.json").exists():
        return None
    rollouts.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(entry / "rollouts.jsonl", rollouts)
    return {**json.loads((entry / "summary.json").read_text()), "cached": key}


def store_start(key: str, result: dict[str, Any], rollouts: Path) -> None:
    """Keep a start score and its trajectories under ``key``, written whole then renamed; prune
    the cache to its ``CACHE_KEEP`` newest entries."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{key}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shutil.copyfile(rollouts, tmp / "rollouts.jsonl")
    (tmp / "summary.json").write_text(json.dumps(result))
    sft.commit_entry(tmp, root / key, CACHE_KEEP)
