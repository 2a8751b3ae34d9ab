"""GAGAR vs GRPO end to end on a pretrained policy: the protocol, fixed before any run, and its runner.

    .venv/bin/python bench/e2e_protocol.py --dry-run                      # the protocol and the runs
    .venv/bin/python bench/e2e_protocol.py --policy /models/Qwen2.5-0.5B-Instruct   # on a GPU machine
    .venv/bin/python bench/e2e_protocol.py --smoke --device cpu           # the pipeline, tiny policy

The protocol (``protocol()``; ``--dry-run`` prints it with every run and checks the split):

- Policy: Qwen2.5-0.5B-Instruct (``--policy``: its Hugging Face folder on disk, 494 M parameters,
  the "0.5B" class; any HF folder the trainer converts works, ``--min-params`` guards the size).
- Warm starts (the unit of analysis): ``WARM_STARTS`` = 10 SFT warm starts from the pretrained
  weights on scripted experts (``spec.model.sftExpertStyles`` of ``examples/gagar-vs-grpo.yaml``:
  bloated passes common), each with its own seed (expert styles, fresh tasks, batch order). Each
  is scored on the held-out set at its start.
- Per warm start: 1 RL seed × 2 arms (``grpo``, ``gagar``), the same tasks in the same order in
  both arms (dynamic sampling off), ``STEPS`` steps of 8 tasks × groups of 8. Issue 50: a second
  warm start buys more power than a second RL seed of the same one at the same GPU cost (the power
  table), so the 20 RL runs go to 10 warm starts × 1 seed, not 5 × 2.
- Held-out set: ≥ 256 tasks: 260 tasks of the synthetic family split off before training
  (``heldOutFraction`` 0.25 of 1,056; the split itself leaves out a held-out task whose content
  equals a training task's — the generator repeats one now and then: 2 of 264 here — so 262
  remain), ``SAMPLES_PER_TASK`` = 4 samples each (the run's own evaluation, then 3 eval-only
  passes of its final policy, pass j with seed + j·10,000, the same in both arms), scored by the
  task's **hidden tests** (the verifier, not the training grader). ``check_split`` checks the
  evaluated tasks again, by id and by content, against the training and the warm start's expert
  tasks, leaves any overlap out of the score, and the protocol refuses to run with fewer than 256
  left.
- Primary outcome: the held-out resolution rate at the end (all samples of a run), GAGAR − GRPO
  per warm start, paired t-test over the 10 warm starts (two-sided) at α = 0.05 **alone**, with
  its 95 % interval. Secondary: response tokens per held-out sample, the bloated share of held-out
  passes (scored by the heuristic grader, the same family as the training grader: read with care),
  the training pass rate's area; Holm over the secondaries only. (The change from the warm start
  is not a secondary: the warm start is common to both arms, so its contrast equals the primary's.)
  With few units a Wilcoxon test has a floor on p, hence the t-test.
- Manipulation check, stated before any run (``manipulation_rule``): the share of held-out
  samples whose response differs between the arms (same warm start, seed, task and sampling
  seed), mean over the pairs, must reach ``MANIPULATION_THRESHOLD`` = 0.10; below it the primary
  is reported as uninformative (the arms did not diverge at lr 1e-6 × 50 steps). ``--smoke``
  measures it too.
- Power (``power_table``, printed by ``--dry-run``): for the paper's +14.8 % relative gain, by base
  rate, for designs of warm starts × seeds × samples per task; binomial sampling plus an assumed
  run-to-run sd of 0.02. At base rates 0.12–0.23 (seen so far) this protocol has power about
  0.35–0.8; the one before issue 50 (5 × 2 × 1) had about 0.2–0.4.
- Failed runs (``FAILED_RUNS``): one retry from scratch with the same seeds; a run failing twice
  drops its warm start (both arms) from every test, named in the result; with fewer than 8 warm
  starts left the primary is reported as incomplete; no run is rerun because of its outcome.
- Time (``estimate()``): written down with how it is estimated; ``--smoke`` on a GPU measures the
  step time that replaces the estimate's assumed one.
- Weights on a GPU host with no hub access: ``--policy`` takes a folder on disk and nothing is
  downloaded. Fetch the folder where the hub is reachable (``huggingface-cli download
  Qwen/Qwen2.5-0.5B-Instruct --local-dir Qwen2.5-0.5B-Instruct``: ``config.json``, the tokenizer
  files and ``model.safetensors``, about 1 GB), then carry it to the host with the checkout (a
  folder the run tool carries, or ``rsync``/``scp`` to e.g. ``/models/``), check its sha256 against
  the one ``huggingface-cli`` printed, and run with ``HF_HUB_OFFLINE=1`` so that nothing tries the
  network; ``--min-params`` refuses a folder smaller than the 0.5B class.

Runs are ``gagar train`` processes (``bench.gagar_vs_grpo.gagar_train``); the result is
``docs/results/e2e-<date>.json`` (``protocol``, ``runs`` with each run's per-task held-out
samples, ``per_warm_start``, ``dropped_warm_starts``, ``manipulation_check``, ``tests``).
``--smoke`` is the pipeline at the smallest budget (1 warm start × 1 seed × 2 arms, 2 samples per
task, ``--steps`` steps, a 4-task held-out set): its numbers answer nothing, except that the
manipulation check is computed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402

RESULTS = ROOT / "docs" / "results"
BASE_MANIFEST = ROOT / "examples" / "gagar-vs-grpo.yaml"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MODEL_PARAMS = 494_032_768  # Qwen2.5-0.5B(-Instruct), tied embeddings counted once
ARMS = ("grpo", "gagar")
WARM_STARTS = 10  # issue 50: warm starts in place of a second RL seed (the power table)
WARM_SEED_BASE = 1000  # warm start k: SFT seed 1000 + k; RL seeds are small: never equal
SEEDS = (0,)
SAMPLES_PER_TASK = 4  # held-out samples per task: 1 with the run, the rest eval-only passes
EVAL_SEED_STEP = 10_000  # eval pass j samples with seed + j·10,000 (both arms the same)
ALPHA = 0.05
PAPER_RELATIVE_GAIN = 0.148  # the paper's +14.8 % relative resolution
MANIPULATION_THRESHOLD = 0.10  # share of held-out samples whose response differs between arms
ASSUMED_RUN_SD = 0.02  # sd of a run's held-out resolution across RL seeds (assumption, power)
HELD_OUT = (
    256  # scored samples at least: held-out tasks whose content a training task shares are not
)
EVAL_TASKS = 260  # evaluated: a margin for expert-task overlaps
DATASET_SIZE = 1056  # × 0.25 = 264 held out, 262 once copies of training tasks are left out
HELD_OUT_FRACTION = 0.25
STEPS = 50
SFT_STEPS = 100
TASKS_PER_STEP, GROUP_SIZE = 8, 8
LR = 1e-6
PRIMARY = "held_out_resolution_end"
OUTCOMES = {  # key: description (the primary first)
    PRIMARY: "held-out resolution rate at the end (hidden tests), one sample per task",
    "held_out_tokens": "response tokens per held-out sample (end)",
    "held_out_bloated_share": "bloated share of held-out passes (heuristic grader)",
    "train_pass_rate_area": "training pass rate, mean over steps",
}
SMOKE = {
    "warm_starts": 1,
    "seeds": [0],
    "samples_per_task": 2,
    "held_out": 2,
    "eval_tasks": 4,
    "dataset_size": 16,
    "sft_steps": 2,
}


# ------------------------------------------------------------------ the protocol
def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The counts this invocation runs (the protocol's, or the smoke's)."""
    if args.smoke:
        return {**SMOKE, "steps": args.steps or 2, "arms": list(ARMS)}
    return {
        "warm_starts": WARM_STARTS,
        "seeds": list(SEEDS),
        "samples_per_task": SAMPLES_PER_TASK,
        "held_out": HELD_OUT,
        "eval_tasks": EVAL_TASKS,
        "dataset_size": DATASET_SIZE,
        "sft_steps": SFT_STEPS,
        "steps": args.steps or STEPS,
        "arms": list(ARMS),
    }


def base_doc(args: argparse.Namespace, s: dict[str, Any]) -> dict[str, Any]:
    """The manifest every run derives from: ``examples/gagar-vs-grpo.yaml`` at the protocol's size."""
    doc = yaml.safe_load(BASE_MANIFEST.read_text())
    spec = doc["spec"]
    styles = spec["model"]["sftExpertStyles"]
    if args.smoke and args.policy is None:  # the tiny policy from scratch: the CPU pipeline
        spec["model"] = {
            "preset": "tiny",
            "dtype": "auto",
            "copyCurriculumSteps": 2,
            "sftWarmupSteps": s["sft_steps"],
            "sftExpertTasks": 16,
            "sftExpertStyles": styles,
        }
        spec["algorithm"].update(groupSize=4, tasksPerStep=2, microBatchSize=4)
    else:
        spec["model"] = {
            "path": str(args.policy or f"<{MODEL}>"),
            "dtype": "auto",
            "sftWarmupSteps": s["sft_steps"],
            "sftExpertTasks": 64,
            "sftExpertStyles": styles,
        }
        spec["algorithm"].update(
            groupSize=GROUP_SIZE, tasksPerStep=TASKS_PER_STEP, microBatchSize=GROUP_SIZE
        )
        spec["algorithm"]["optimizer"] = {**spec["algorithm"].get("optimizer", {}), "lr": LR}
        spec["rollout"]["agent"]["concurrency"] = TASKS_PER_STEP * GROUP_SIZE
        spec["sandbox"]["poolSize"] = 16
    spec["algorithm"]["totalSteps"] = s["steps"]
    spec["algorithm"]["dynamicSampling"] = {"enabled": False}  # same tasks, same order, every arm
    spec["trainer"]["device"] = spec["rollout"]["device"] = args.device
    spec["trainer"]["checkpoint"] = {"intervalSteps": 10, "keep": 1}
    spec["dataset"] = {
        "sources": [{"kind": "synthetic", "size": s["dataset_size"], "seed": 0}],
        "heldOutFraction": HELD_OUT_FRACTION,
    }
    return doc


def named(doc: dict[str, Any], name: str, **algorithm: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    out["metadata"]["name"] = name
    out["spec"]["algorithm"].update(algorithm)
    return out


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The protocol and every run, in order: each warm start, then its seeds × arms."""
    s = settings(args)
    base = base_doc(args, s)
    work = Path(args.work)
    runs: list[dict[str, Any]] = []
    for k in range(s["warm_starts"]):
        warm_seed = WARM_SEED_BASE + k
        warm = named(base, f"warm{k}", seed=warm_seed)
        runs.append(
            {
                "kind": "warm_start",
                "warm_start": k,
                "warm_seed": warm_seed,
                "out": str(work / f"warm{k}"),
                "manifest": warm,
                "args": ["--eval-only", "--eval-tasks", str(s["eval_tasks"])],
            }
        )
        model = {
            "path": str(work / f"warm{k}-policy"),
            "dtype": base["spec"]["model"]["dtype"],
            "sftWarmupSteps": 0,
        }
        for seed in s["seeds"]:
            for arm in s["arms"]:
                doc = named(base, f"{arm}-w{k}-s{seed}", seed=seed, mode=arm)
                doc["spec"]["model"] = model
                rl = {
                    "kind": "rl",
                    "warm_start": k,
                    "warm_seed": warm_seed,
                    "seed": seed,
                    "arm": arm,
                    "eval_pass": 0,
                    "out": str(work / f"{arm}-w{k}-s{seed}"),
                    "manifest": doc,
                    "args": ["--eval-tasks", str(s["eval_tasks"])],
                }
                runs += [rl, *eval_passes(rl, s)]
    protocol = {
        "question": "does GAGAR raise held-out resolution over GRPO on a pretrained policy?",
        "policy": {
            "model": MODEL if not (args.smoke and args.policy is None) else "tiny preset",
            "path": base["spec"]["model"].get("path"),
            "parameters": MODEL_PARAMS,
        },
        "unit": "warm start (seeds averaged within it); never steps, samples or seeds",
        "warm_starts": s["warm_starts"],
        "warm_seeds": [WARM_SEED_BASE + k for k in range(s["warm_starts"])],
        "seeds": s["seeds"],
        "arms": s["arms"],
        "steps": s["steps"],
        "sft_steps": s["sft_steps"],
        "trajectories_per_step": base["spec"]["algorithm"]["tasksPerStep"]
        * base["spec"]["algorithm"]["groupSize"],
        "held_out": {
            "samples": s["held_out"],
            "samples_per_task": s["samples_per_task"],
            "evaluated": s["eval_tasks"],
            "per_task": 1,
            "scored_by": "hidden tests (verifier)",
            "excluded": "held-out tasks whose content equals a training or expert task's",
            "dataset_size": s["dataset_size"],
            "held_out_fraction": HELD_OUT_FRACTION,
        },
        "primary": {
            "outcome": PRIMARY,
            "contrast": "gagar − grpo",
            "test": f"paired t over warm starts (bench/stats.paired_t), two-sided, α {ALPHA}, "
            "alone (not in the Holm family)",
        },
        "outcomes": OUTCOMES,
        "multiplicity": "the primary at α alone; Holm over the secondaries only",
        "manipulation_check": manipulation_rule(),
        "failed_runs": FAILED_RUNS,
        "power": power_table(s),
        "smoke": bool(args.smoke),
        "device": args.device,
        "estimate": estimate(s, base),
    }
    return {"protocol": protocol, "runs": runs}


FAILED_RUNS = (
    "a run that fails (its process exits non-zero, the engine is lost) is retried once from "
    "scratch with the same seeds; a run failing twice drops its warm start from every test (the "
    "warm start is the unit: both arms go), and the dropped ones are named in the result; with "
    f"fewer than {WARM_STARTS - 2} warm starts left the primary is reported as incomplete, not "
    "tested; no run is ever rerun because of its outcome"
)


def eval_passes(rl: dict[str, Any], s: dict[str, Any]) -> list[dict[str, Any]]:
    """The extra held-out samples of an RL run: ``samples_per_task − 1`` eval-only passes of its
    final policy, pass j sampling with seed ``seed + j·EVAL_SEED_STEP`` (the same in both arms)."""
    out = []
    for j in range(1, s["samples_per_task"]):
        doc = json.loads(json.dumps(rl["manifest"]))
        doc["metadata"]["name"] = f"{doc['metadata']['name']}-e{j}"
        doc["spec"]["algorithm"]["seed"] = rl["seed"] + j * EVAL_SEED_STEP
        doc["spec"]["model"] = {
            **doc["spec"]["model"],
            "path": str(Path(rl["out"]) / "policy" / "serving"),
        }
        out.append(
            {
                **{k: rl[k] for k in ("warm_start", "warm_seed", "seed", "arm")},
                "kind": "eval",
                "eval_pass": j,
                "out": f"{rl['out']}-e{j}",
                "manifest": doc,
                "args": ["--eval-only", "--eval-tasks", str(s["eval_tasks"])],
            }
        )
    return out


def manipulation_rule() -> dict[str, Any]:
    return {
        "measure": "per (warm start, seed, eval pass): the share of held-out tasks whose sampled "
        "response differs between the arms (response tokens or outcome differ; same task, same "
        "sampling seed), averaged over the pairs",
        "threshold": MANIPULATION_THRESHOLD,
        "rule": f"stated before any run: below {MANIPULATION_THRESHOLD} the arms' policies did not "
        "diverge enough for the primary to answer anything; it is then reported as "
        "uninformative, and a protocol with a larger learning rate is a new protocol (never a "
        "rerun on this held-out set). Measured in --smoke too. GPU sampling is not "
        "bit-reproducible: the share bounds from above what the weights alone cause",
    }


def manipulation_check(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The manipulation check's value from the runs' per-task held-out samples."""
    by_key: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in runs:
        if r["kind"] in ("rl", "eval") and "samples" in r.get("outcomes", {}):
            key = (r["warm_start"], r["seed"], r.get("eval_pass", 0))
            by_key.setdefault(key, {})[r["arm"]] = r["outcomes"]["samples"]
    pairs = []
    for key, arms in sorted(by_key.items()):
        if {"grpo", "gagar"} <= arms.keys():
            a, b = arms["grpo"], arms["gagar"]
            tasks = sorted(a.keys() & b.keys())
            if tasks:
                differ = sum(a[t] != b[t] for t in tasks)
                pairs.append({"warm_start": key[0], "seed": key[1], "eval_pass": key[2],
                              "tasks": len(tasks), "differ": differ})  # fmt: skip
    share = statistics.fmean(p["differ"] / p["tasks"] for p in pairs) if pairs else math.nan
    return {
        **manipulation_rule(),
        "pairs": pairs,
        "value": share,
        "passed": bool(share >= MANIPULATION_THRESHOLD) if pairs else None,
    }


def power(base: float, warm: int, seeds: int, per_task: int, tasks: int = HELD_OUT) -> float:
    """Power of the two-sided paired t over ``warm`` warm starts (α = ALPHA) for the paper's
    relative gain at base rate ``base``. Per warm start the arm difference has variance
    2 (p(1 − p) / (tasks · per_task) + ASSUMED_RUN_SD²) / seeds: binomial sampling of the held-out
    samples plus run-to-run spread, no warm start × arm interaction (optimistic), no positive
    correlation of the arms on a task (pessimistic)."""
    from scipy import stats as st

    delta = PAPER_RELATIVE_GAIN * base
    var = 2 * (base * (1 - base) / (tasks * per_task) + ASSUMED_RUN_SD**2) / seeds
    nc = delta / math.sqrt(var) * math.sqrt(warm)
    crit = st.t.ppf(1 - ALPHA / 2, warm - 1)
    return float(st.nct.sf(crit, warm - 1, nc) + st.nct.cdf(-crit, warm - 1, nc))


DESIGNS = (  # (warm starts, RL seeds, samples per task)
    (5, 2, 1),  # the protocol before issue 50
    (5, 2, 4),
    (10, 1, 1),
    (10, 1, 4),
    (20, 1, 4),
)
BASE_RATES = (0.10, 0.15, 0.20, 0.25, 0.30, 0.40)


def power_table(s: dict[str, Any]) -> dict[str, Any]:
    """Power by base rate for the designs (``power``), each with its RL runs and eval passes."""
    chosen = (s["warm_starts"], len(s["seeds"]), s["samples_per_task"])
    designs = list(dict.fromkeys((*DESIGNS, chosen)))
    return {
        "effect": f"+{PAPER_RELATIVE_GAIN:.1%} relative (the paper's), two-sided α {ALPHA}",
        "assumptions": f"held-out tasks {HELD_OUT}; run-to-run sd {ASSUMED_RUN_SD} (assumed: no "
        "GPU run has measured it); see bench/e2e_protocol.power",
        "designs": [
            {
                "warm_starts": w,
                "seeds": r,
                "samples_per_task": k,
                "rl_runs": w * r * 2,
                "eval_passes": w * r * 2 * (k - 1),
                "this_protocol": (w, r, k) == chosen,
                "power": {f"{p:.2f}": round(power(p, w, r, k), 3) for p in BASE_RATES},
            }
            for w, r, k in designs
        ],
    }


def estimate(s: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Expected GPU time, and how it is estimated (no GPU measured it yet: replace
    ``assumed_step_seconds`` by a ``--smoke`` run's measured ``step_seconds``).

    Per RL step (64 trajectories, ≤ 6 turns of ≤ 128 tokens, contexts ≤ 3,072 tokens):
    generation ≤ 49,152 tokens at an assumed 5,000 tokens/s for a 0.5B model in vLLM on one H100
    with 64 concurrent agent loops (far below its batched peak: turns wait on sandboxes) ≈ 10 s;
    sandboxes and verification ≈ 12 s (measured here: ``make run``'s rollout stage, 11.6 s per
    step of 8 trajectories on 2 CPU cores, taken as a CPU cost of 2.9 core-s per trajectory, on
    the GPU machine's 16 cores); the update 6 × 0.494e9 × 128k tokens ≈ 3.8e14 FLOP at 25 % of
    the H100's 989 TFLOP/s bf16 ≈ 1.5 s, with the weight sync and checkpoints ≈ 3 s: ≈ 25 s.
    The held-out evaluation of 256 samples ≈ 4 steps' rollouts; a process start (vLLM load,
    CUDA graphs) ≈ 90 s; a warm start ≈ 100 SFT steps × 1 s + 64 expert tasks + the start
    evaluation ≈ 5 min. Uncertain by 2× either way."""
    step = 25.0
    traj = base["spec"]["algorithm"]["tasksPerStep"] * base["spec"]["algorithm"]["groupSize"]
    eval_s = step * s["eval_tasks"] / max(1, traj)
    rl = 90 + s["steps"] * step + eval_s
    warm = 90 + s["sft_steps"] * 1.0 + 60 + eval_s
    runs_rl = s["warm_starts"] * len(s["seeds"]) * len(s["arms"])
    passes = runs_rl * (s["samples_per_task"] - 1) * (90 + eval_s)  # eval-only passes
    total = s["warm_starts"] * warm + runs_rl * rl + passes
    return {
        "assumed_step_seconds": step,
        "rl_run_minutes": round(rl / 60, 1),
        "warm_start_minutes": round(warm / 60, 1),
        "eval_pass_minutes": round((90 + eval_s) / 60, 1),
        "gpu_hours_one_h100": round(total / 3600, 2),
        "how": "a stage model (docstring of bench/e2e_protocol.estimate), not a measurement: "
        "no GPU has run it; ±2×",
    }


# ------------------------------------------------------------------ the split
def check_split(doc: dict[str, Any], evaluated: int, needed: int) -> dict[str, Any]:
    """The held-out tasks the runs evaluate (the first ``evaluated`` of the split) against the
    training tasks and the warm start's expert tasks, by id and by content: ``excluded`` lists those
    that share a training or expert task's content (left out of every score); ``scored`` must
    reach ``needed``."""
    from gagar.driver import components as comp
    from gagar.driver.setup import sft_tasks
    from gagar.spec import GagarRun

    run = GagarRun.model_validate(doc)
    train, held = comp.load_datasets(run.spec.dataset)
    if len(held) < evaluated:
        raise SystemExit(
            f"the split holds {len(held)} held-out tasks, the protocol evaluates {evaluated}"
        )
    tasks = held[:evaluated]
    flat = list(train)
    experts = sft_tasks(run, flat)
    ids = {t.instance_id for t in tasks}
    seen = {t.content_key() for t in flat} | {t.content_key() for t in experts}
    excluded = sorted(t.instance_id for t in tasks if t.content_key() in seen)
    split = {
        "evaluated": len(tasks),
        "distinct": len(ids),
        "train": len(flat),
        "experts": len(experts),
        "excluded": excluded,
        "scored": len(tasks) - len(excluded),
        "id_overlap": len(ids & ({t.instance_id for t in flat} | {t.instance_id for t in experts})),
    }
    if split["id_overlap"] or split["scored"] < needed:
        raise SystemExit(f"the held-out split does not serve the protocol: {split}")
    return split


# ------------------------------------------------------------------ outcomes and analysis
def read_outcomes(out: Path, excluded: set[str]) -> dict[str, Any]:
    """The numbers one run contributes (the only place that reads a run's files): the held-out
    samples' hidden-test outcomes without the ``excluded`` tasks, the training pass rates."""
    report = json.loads((out / "report.json").read_text())
    samples = [
        x
        for x in (report.get("held_out") or {}).get("samples", [])
        if x["valid"] and x["task"] not in excluded
    ]
    passes_ = [x for x in samples if x["passed"]]
    log = out / "metrics.jsonl"
    records = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    passes = [r["pass_rate"] for r in records if r.get("pass_rate") is not None]
    return {
        "resolution": len(passes_) / len(samples) if samples else math.nan,
        "scored": len(samples),
        # per task (the record a reader recomputes from): [passed, response tokens]
        "samples": {x["task"]: [bool(x["passed"]), x["tokens"]] for x in samples},
        "tokens": statistics.fmean(x["tokens"] for x in samples) if samples else math.nan,
        "bloated_share": sum(x["bloated"] for x in passes_) / len(passes_) if passes_ else math.nan,
        "train_pass_rate_area": statistics.fmean(passes) if passes else math.nan,
        "step_seconds": statistics.fmean(r["step_seconds"] for r in records)
        if records
        else math.nan,
    }


def per_warm_start(runs: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, float]]]:
    """Warm start → arm → outcome: per seed the mean over the run's held-out passes (its own and
    the eval-only ones), then the mean over the warm start's seeds (the unit)."""
    per_seed: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        if r["kind"] in ("rl", "eval") and "outcomes" in r:
            per_seed.setdefault((r["warm_start"], r["arm"], r["seed"]), []).append(r)
    rows: dict[tuple[int, str], list[dict[str, float]]] = {}
    for (w, arm, _), group in per_seed.items():
        if not any(r["kind"] == "rl" for r in group):
            continue
        rl = next(r for r in group if r["kind"] == "rl")["outcomes"]
        o = [r["outcomes"] for r in group]
        rows.setdefault((w, arm), []).append({
            PRIMARY: stats.run_mean([x["resolution"] for x in o]),
            "held_out_tokens": stats.run_mean([x["tokens"] for x in o]),
            "held_out_bloated_share": stats.run_mean([x["bloated_share"] for x in o]),
            "train_pass_rate_area": rl["train_pass_rate_area"],
        })  # fmt: skip
    out: dict[int, dict[str, dict[str, float]]] = {}
    for (w, arm), seeds in rows.items():
        out.setdefault(w, {})[arm] = {k: stats.run_mean([x[k] for x in seeds]) for k in OUTCOMES}
    return out


def analyse(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired t-test of gagar − grpo over warm starts for every outcome: the primary at α alone,
    Holm over the secondaries; the warm starts dropped (``FAILED_RUNS``) and the manipulation
    check beside them."""
    table = per_warm_start(runs)
    both = sorted(w for w, arms in table.items() if {"gagar", "grpo"} <= arms.keys())
    planned = sorted({r["warm_start"] for r in runs})
    dropped = [w for w in planned if w not in both]
    tests = {
        k: {
            **stats.paired_t(
                [table[w]["gagar"][k] for w in both], [table[w]["grpo"][k] for w in both]
            ),
            "primary": k == PRIMARY,
        }
        for k in OUTCOMES
    }
    primary = tests[PRIMARY]
    primary["alpha"] = ALPHA
    primary["complete"] = len(both) >= max(2, len(planned) - 2)  # FAILED_RUNS
    primary["significant"] = bool(primary["complete"] and primary["p_value"] < ALPHA)
    secondary = [t for k, t in tests.items() if k != PRIMARY]
    for t, p in zip(secondary, stats.holm([t["p_value"] for t in secondary]), strict=True):
        t["p_holm"] = p
    return {
        "per_warm_start": {str(w): table[w] for w in sorted(table)},
        "dropped_warm_starts": dropped,
        "manipulation_check": manipulation_check(runs),
        "tests": tests,
    }


# ------------------------------------------------------------------ running
def execute(args: argparse.Namespace, the_plan: dict[str, Any]) -> int:
    from bench.gagar_vs_grpo import RunFailed, gagar_train

    out_json = Path(args.json)
    runs = the_plan["runs"]
    failed = 0
    for r in runs:
        out = Path(r["out"])
        name = r["manifest"]["metadata"]["name"]
        if r["kind"] != "warm_start" and not Path(r["manifest"]["spec"]["model"]["path"]).exists():
            print(f"{name}: skipped, the run it starts from failed", flush=True)
            failed += 1
            continue
        print(f"{name} → {out}", flush=True)
        for attempt in (1, 2):  # FAILED_RUNS: one retry from scratch, same seeds
            try:
                if out.exists():
                    shutil.rmtree(out)
                r["seconds"] = gagar_train(r["manifest"], out, *r["args"])
                r.pop("error", None)
                break
            except RunFailed as err:
                print(f"  failed (attempt {attempt}): {err}", flush=True)
                r["error"] = str(err)
                r["attempts"] = attempt
        if "error" in r:
            failed += 1
            continue
        r["outcomes"] = read_outcomes(out, set(the_plan["protocol"]["split"]["excluded"]))
        if r["kind"] == "warm_start":
            policy = out.parent / f"{out.name}-policy"
            if policy.exists():
                shutil.rmtree(policy)
            shutil.copytree(out / "policy" / "serving", policy)
        print(f"  {r['outcomes']} · {r['seconds']:.0f} s", flush=True)
        result = {
            **the_plan,
            "runs": [{k: v for k, v in x.items() if k != "manifest"} for x in runs],
            **analyse(runs),
            "machine": {"loadavg": os.getloadavg()},  # save adds the CPU and its cores
        }
        save(out_json, result, indent=1, default=str)
    print(f"-> {out_json}")
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policy", type=Path, help=f"HF folder of the pretrained policy ({MODEL})")
    p.add_argument(
        "--dry-run", action="store_true", help="print the protocol and the runs; run nothing"
    )
    p.add_argument(
        "--smoke", action="store_true", help="1 warm start × 1 seed × 2 arms: answers nothing"
    )
    p.add_argument("--steps", type=int, help=f"RL steps per run (default {STEPS}; smoke 2)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--min-params", type=float, default=4.9e8, help="refuse a smaller policy")
    p.add_argument("--work", default=str(ROOT / "runs" / "e2e"))
    p.add_argument("--json", default=str(RESULTS / f"e2e-{dt.date.today().isoformat()}.json"))
    return p.parse_args(argv)


def print_power(proto: dict[str, Any]) -> None:
    table, check = proto["power"], proto["manipulation_check"]
    rates = list(table["designs"][0]["power"])
    print(f"\npower for {table['effect']} ({table['assumptions']})")
    print(
        "warm starts × seeds × samples/task  RL runs  eval passes  "
        + "  ".join(f"p={r}" for r in rates)
    )
    for d in table["designs"]:
        mark = "  ← this protocol" if d["this_protocol"] else ""
        cells = "  ".join(f"{d['power'][r]:6.2f}" for r in rates)
        print(f"{d['warm_starts']:>11} × {d['seeds']} × {d['samples_per_task']:<13} {d['rl_runs']:>7}  "
              f"{d['eval_passes']:>11}  {cells}{mark}")  # fmt: skip
    print(f"\nmanipulation check: {check['measure']}; threshold {check['threshold']}")


def policy_params(folder: Path) -> int:
    """Parameters of an HF folder, from its safetensors headers (no weights read)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                total += math.prod(fh.get_slice(key).get_shape())
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    the_plan = plan(args)
    proto = the_plan["protocol"]
    held = proto["held_out"]
    proto["split"] = check_split(
        the_plan["runs"][0]["manifest"], held["evaluated"], held["samples"]
    )
    if args.dry_run:
        print(yaml.safe_dump(proto, sort_keys=False, allow_unicode=True))
        for r in the_plan["runs"]:
            print(
                f"{r['kind']:<10} warm {r['warm_start']} (seed {r['warm_seed']})  "
                f"{r.get('arm', ''):<5} seed {r.get('seed', '-')}  → {r['out']}"
            )
        print_power(proto)
        return 0
    if args.policy is not None:
        n = policy_params(args.policy)
        if n < args.min_params:
            raise SystemExit(
                f"{args.policy}: {n:,} parameters, below --min-params {args.min_params:,.0f}"
            )
        proto["policy"]["parameters"] = n
    elif not args.smoke:
        raise SystemExit(f"--policy is required (an HF folder of {MODEL}), or --smoke or --dry-run")
    t0 = time.perf_counter()
    rc = execute(args, the_plan)
    print(f"{time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
