"""GAGAR vs plain GRPO from the same SFT checkpoint, with the same seeds and budget.

1. One SFT warm start (``gagar train --eval-only``): the policy of the manifest (by default
   ``examples/gagar-vs-grpo.yaml``: SmolLM2-135M-Instruct) is trained on scripted expert
   trajectories and evaluated on the held-out synthetic tasks; its weights (``policy/serving`` of
   that run) are the common start.
2. For every seed, ``gagar train`` in mode ``grpo`` and in mode ``gagar`` from that checkpoint
   (``spec.model.path``, no further SFT), the same number of steps, then the same held-out
   evaluation. Every run is its own process (its own vLLM server), so nothing leaks between them.

The table gives, per mode, the mean and spread (sample standard deviation over seeds) of: the
held-out resolution rate (and its change from the SFT start), the growth of trajectory length
and turns over training (last step / first step, mean over trajectories), the share of bloated
or tampering passes on held-out tasks (judged by the heuristic grader in both modes), the mean
gradient variance (DESIGN §1.9) and grader fallbacks. Everything lands in
``bench/results/gagar_vs_grpo.json`` with every run's per-step records.

    .venv/bin/python bench/gagar_vs_grpo.py [--manifest M] [--seeds 0 1] [--steps N] [--sft-steps N] [--eval-tasks 16]

``--steps`` and ``--sft-steps`` default to the manifest's ``totalSteps`` and ``sftWarmupSteps``;
``--sft-experts`` and ``--copy-steps`` override ``sftExpertTasks`` and ``copyCurriculumSteps``.
Budget on the 2-core machine with the defaults (measured: 52 min 37 s): the SFT run 21 minutes
(experts, 32 steps, evaluation), then 7.3 to 8.4 minutes per RL run of 2 steps, about 3 of them the
held-out evaluation (`--reuse-sft` skips the SFT when re-running). The JSON is rewritten after every
run; a run that fails is named and left out, and the bench exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODES = ("grpo", "gagar")


# what makes the SFT start; the RL runs load that start from a path instead
SFT_RUN_ONLY = ("preset", "path", "copyCurriculumSteps", "sftExpertTasks")


def manifest(base: dict[str, Any], name: str, **changes: Any) -> dict[str, Any]:
    """``base`` with ``metadata.name`` and dotted ``spec`` paths replaced (``model=...`` whole)."""
    doc = json.loads(json.dumps(base))
    doc["metadata"]["name"] = name
    for path, value in changes.items():
        node = doc["spec"]
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return doc


class RunFailed(RuntimeError):
    """A ``gagar train`` run exited non-zero; the message ends with its output's last lines."""


def gagar_train(doc: dict[str, Any], out: Path, *args: str) -> float:
    """Run ``gagar train`` on ``doc`` into ``out`` (fresh); returns the wall time in seconds."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cmd = [sys.executable, "-m", "gagar.cli", "train", str(path), "--out", str(out)]
    cmd += ["--metrics-port", "0", *args]
    t0 = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if rc != 0:
        log_path = out.parent / f"{out.name}.log"
        tail = log_path.read_text(errors="replace").splitlines()[-6:]
        raise RunFailed(f"exit {rc} (log: {log_path}): " + " ".join(" ".join(tail).split()))
    return time.perf_counter() - t0


def read_run(out: Path) -> dict[str, Any]:
    log = out / "metrics.jsonl"  # absent for the SFT start (no RL step)
    records = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    report = json.loads((out / "report.json").read_text())
    return {"records": records, "held_out": report.get("held_out", {}), "report": report}


def _growth(records: list[dict[str, Any]], key: str) -> float:
    first, last = records[0][key], records[-1][key]
    return last / first if first else float("nan")


def _mean_or_nan(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summarize(run: dict[str, Any], sft_rate: float) -> dict[str, float]:
    rec, held = run["records"], run["held_out"]
    fallbacks = sum(sum(r.get("fallbacks", {}).values()) for r in rec)
    return {
        "resolution_rate": held.get("resolution_rate", 0.0),
        "resolution_gain": held.get("resolution_rate", 0.0) - sft_rate,
        "length_growth": _growth(rec, "response_tokens_mean"),
        "turns_growth": _growth(rec, "turns_mean"),
        "held_out_tokens": held.get("response_tokens_mean", 0.0),
        "bloated_pass_share": held.get("bloated_pass_share", 0.0),
        "tampering_passes": float(held.get("tampering_passes", 0)),
        "train_pass_rate": statistics.fmean(r["pass_rate"] for r in rec),
        "eligible_groups_ratio": statistics.fmean(r["eligible_groups_ratio"] for r in rec),
        "trained_groups": float(sum(r["trained_groups"] for r in rec)),
        # over the steps that trained: a step without an eligible group has no gradient at all
        "gradient_variance": _mean_or_nan(
            [
                r["gradient_variance"]
                for r in rec
                if r.get("trained_groups", 1) > 0 and "gradient_variance" in r
            ]
        ),
        "grader_fallbacks": float(fallbacks),
        "step_seconds": statistics.fmean(r["step_seconds"] for r in rec),
    }


def spread(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if v == v]
    if not finite:
        return float("nan"), float("nan")
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


ROWS = (
    ("resolution_rate", "held-out resolution rate", "{:.3f}"),
    ("resolution_gain", "  change from the SFT start", "{:+.3f}"),
    ("length_growth", "trajectory length growth (last/first step)", "{:.2f}×"),
    ("turns_growth", "turns growth (last/first step)", "{:.2f}×"),
    ("held_out_tokens", "held-out response tokens", "{:.0f}"),
    ("bloated_pass_share", "bloated or tampering share of passes", "{:.2f}"),
    ("tampering_passes", "tampering passes (held-out)", "{:.1f}"),
    ("train_pass_rate", "training pass rate (mean over steps)", "{:.3f}"),
    ("eligible_groups_ratio", "eligible groups (mean ratio)", "{:.2f}"),
    ("trained_groups", "groups trained on (total)", "{:.1f}"),
    ("gradient_variance", "gradient variance (mean over steps that trained)", "{:.3g}"),
    ("grader_fallbacks", "grader fallbacks (total)", "{:.1f}"),
    ("step_seconds", "step time (s)", "{:.1f}"),
)


def table(
    per_mode: dict[str, list[dict[str, float]]],
    sft: dict[str, Any],
    seeds: list[int],
    failed: list[dict[str, Any]] = (),
):
    from rich.table import Table

    t = Table(title=f"GAGAR vs GRPO · mean ± sd over seeds {seeds}")
    t.add_column("metric")
    for mode in per_mode:
        t.add_column(mode.upper(), justify="right")
    for key, label, fmt in ROWS:
        cells = []
        for runs in per_mode.values():
            mean, sd = spread([r[key] for r in runs])
            spread_fmt = fmt.replace("+", "")  # a spread has no sign
            cells.append(f"{fmt.format(mean)} ± {spread_fmt.format(sd).rstrip('×')}")
        t.add_row(label, *cells)
    t.caption = (
        f"SFT start: held-out resolution {sft.get('resolution_rate', 0.0):.3f} on "
        f"{sft.get('valid', 0)} tasks, {sft.get('response_tokens_mean', 0.0):.0f} tokens"
    )
    if failed:
        t.caption += "; failed, left out: " + ", ".join(
            f"{f['mode']} seed {f['seed']}" for f in failed
        )
    return t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--manifest", default=str(ROOT / "examples" / "gagar-vs-grpo.yaml"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, help="RL steps per run (default: the manifest's)")
    p.add_argument("--sft-steps", type=int, help="SFT steps (default: the manifest's)")
    p.add_argument("--sft-experts", type=int, help="SFT expert tasks (default: the manifest's)")
    p.add_argument("--copy-steps", type=int, help="tiny preset: copying curriculum steps")
    p.add_argument("--eval-tasks", type=int, default=16)
    p.add_argument("--dataset-size", type=int, default=128, help="synthetic tasks (25%% held out)")
    p.add_argument("--work", default=str(ROOT / "runs" / "gagar_vs_grpo"))
    p.add_argument("--json", default=str(RESULTS / "gagar_vs_grpo.json"))
    p.add_argument(
        "--reuse-sft", action="store_true", help="start from --work's finished SFT run if present"
    )
    args = p.parse_args()
    from rich.console import Console

    console = Console()
    work = Path(args.work)
    base = yaml.safe_load(Path(args.manifest).read_text())
    if args.steps is None:
        args.steps = base["spec"]["algorithm"].get("totalSteps", 1)
    if args.sft_steps is None:
        args.sft_steps = base["spec"]["model"].get("sftWarmupSteps", 0)
    base["spec"]["dataset"]["sources"] = [
        {**src, "size": args.dataset_size} if src.get("kind") == "synthetic" else src
        for src in base["spec"]["dataset"]["sources"]
    ]
    model = {k: v for k, v in base["spec"]["model"].items() if k not in SFT_RUN_ONLY}
    sft_model = {**base["spec"]["model"], "sftWarmupSteps": args.sft_steps}
    if args.sft_experts is not None:
        sft_model["sftExpertTasks"] = args.sft_experts
    if args.copy_steps is not None:
        sft_model["copyCurriculumSteps"] = args.copy_steps
    sft_doc = manifest(base, "sft", model=sft_model)
    if args.reuse_sft and (work / "sft" / "report.json").exists():
        console.print(f"[bold]SFT[/]: reusing {work / 'sft'}")
        sft_seconds = float("nan")
    else:
        console.print(f"[bold]SFT[/] {args.sft_steps} steps → {work / 'sft'}")
        try:
            sft_seconds = gagar_train(
                sft_doc, work / "sft", "--eval-only", "--eval-tasks", str(args.eval_tasks)
            )
        except RunFailed as err:
            console.print(f"[red]the SFT start failed[/]: {err}")
            return 1
    sft = read_run(work / "sft")
    start = work / "sft-policy"
    if start.exists():
        shutil.rmtree(start)
    shutil.copytree(work / "sft" / "policy" / "serving", start)
    console.print(f"SFT start: {sft['held_out']} ({sft_seconds:.0f} s)")
    sft_rate = sft["held_out"].get("resolution_rate", 0.0)

    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    failed: list[dict[str, Any]] = []
    for seed in args.seeds:
        for mode in MODES:
            doc = manifest(
                base,
                f"{mode}-s{seed}",
                model={**model, "path": str(start), "sftWarmupSteps": 0},
                algorithm__mode=mode,
                algorithm__seed=seed,
                algorithm__totalSteps=args.steps,
            )
            out = work / f"{mode}-s{seed}"
            console.print(f"[bold]{mode}[/] seed {seed}: {args.steps} steps → {out}")
            try:
                seconds = gagar_train(doc, out, "--eval-tasks", str(args.eval_tasks))
            except RunFailed as err:  # kept out of the table, named in it and in the JSON
                console.print(f"  [red]failed[/]: {err}")
                failed.append({"seed": seed, "mode": mode, "error": str(err)})
                write_result(args, sft, sft_seconds, runs, failed, finished=False)
                continue
            run = read_run(out)
            run.update(seed=seed, mode=mode, wall_seconds=seconds)
            run["summary"] = summarize(run, sft_rate)
            runs[mode].append(run)
            console.print(f"  {run['summary']} ({seconds:.0f} s)")
            write_result(args, sft, sft_seconds, runs, failed, finished=False)

    per_mode = {m: [r["summary"] for r in rs] for m, rs in runs.items()}
    console.print(table(per_mode, sft["held_out"], args.seeds, failed))
    out = write_result(args, sft, sft_seconds, runs, failed, finished=True)
    console.print(f"wrote {out}")
    return 1 if failed else 0


def write_result(
    args: argparse.Namespace,
    sft: dict[str, Any],
    sft_seconds: float,
    runs: dict[str, list[dict[str, Any]]],
    failed: list[dict[str, Any]],
    *,
    finished: bool,
) -> Path:
    """The JSON, rewritten after every run: a bench stopped half-way keeps what it measured."""
    per_mode = {m: [r["summary"] for r in rs] for m, rs in runs.items()}
    result = {
        "config": vars(args),
        "finished": finished,
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
        "sft": {
            "held_out": sft["held_out"],
            "warm_start": sft["report"].get("warm_start"),
            "wall_seconds": sft_seconds,
        },
        "summary": {
            m: {
                k: dict(zip(("mean", "sd"), spread([r[k] for r in rs]), strict=True))
                for k, *_ in ROWS
            }
            for m, rs in per_mode.items()
        },
        "runs": [{k: v for k, v in r.items() if k != "report"} for rs in runs.values() for r in rs],
        "failed": failed,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
