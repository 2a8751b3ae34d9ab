"""GAGAR vs GRPO (and GAGAR's two halves) from one warm start, with the same seeds and tasks.

1. One warm start (``gagar train --eval-only --eval-tasks 0`` of the manifest, by default
   ``examples/gagar-vs-grpo.yaml``: the tiny policy, SFT on scripted experts whose style mix
   ``spec.model.sftExpertStyles`` makes bloated passes common): its weights are the common start.
2. For every seed and every arm, ``gagar train`` from that start (``spec.model.path``), the same
   steps, the same seed; dynamic sampling is off, so every arm draws the same tasks in the same
   order. The arms (``ARMS``): ``grpo``; ``gagar``; ``gagar-redistribution`` (the grader's
   redistribution only: length penalty and segment shaping off); ``gagar-shaping`` (length
   penalty and segment shaping only: every quality factor 1, so the redistribution is the
   identity). Every run scores the probe set (``gagar train --probe``: fixed samples of training
   tasks with fixed seeds, never tuned on) at its end; the start score is the same for all (the
   same weights, samples and seeds), so the first run rolls it out and the others read it from
   gagar's per-machine probe cache, keyed by the weights' digest (``gagar.driver.probe``).
3. Per arm: mean and 95 % interval over seeds of every metric (``METRICS``); paired tests of each
   arm against ``grpo`` with the seed as the unit (Wilcoxon signed-rank, sign test beside it; a
   step-level series enters as its per-run summary, e.g. the area under the pass-rate curve), and
   Holm's correction over every test of the file (``p_holm``). Seeds vary sampling from ONE warm
   start: a claim about GAGAR in general needs warm starts as the unit, which this bench does not
   vary. With 3 seeds no two-sided Wilcoxon or sign test can go below p = 0.25. Probe samples
   passed by one arm only are counted, not tested (one run's samples share its weights). One PNG
   per metric (a line per arm, its band the 95 % interval over seeds), a Markdown table, and the
   JSON ``docs/results/gagar_vs_grpo-<date>.json``: ``protocol``, ``arms`` (arm → per-seed records
   with per-step series), ``tests`` (metric → ``{"statistic", "p_value", "p_holm", "n", ...}``),
   ``replay`` (the
   newest ``bench/gagar_replay.py`` result).

    .venv/bin/python bench/gagar_vs_grpo.py [--seeds 0 1 2] [--steps 10] [--probe 64] [--quick]

``--quick`` is the pipeline end to end in minutes (one seed, two steps, a tiny warm start): its
numbers answer nothing. ``--reuse-sft`` starts from ``--work``'s finished warm start. The JSON is
rewritten after every run; a run that fails is named and left out, and the bench exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.driver.record import StepRecord, field_value, read_records  # noqa: E402

RESULTS = ROOT / "docs" / "results"
QUALITY_ONE = {k: 1.0 for k in ("t1First", "t1Other", "t2High", "t2Low", "t3")}
ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"mode": "grpo"},
    "gagar": {"mode": "gagar"},
    "gagar-redistribution": {
        "mode": "gagar",
        "lengthPenalty": {"enabled": False},
        "segmentPenalty": {"enabled": False},
    },
    "gagar-shaping": {"mode": "gagar", "redistribution": {"qualityFactors": QUALITY_ONE}},
}

# what makes the warm start; the RL runs load that start from a path instead
SFT_RUN_ONLY = ("preset", "path", "copyCurriculumSteps", "sftExpertTasks", "sftExpertStyles")

# --quick: the whole pipeline at the smallest budget (tests); its numbers answer nothing
QUICK = {
    "seeds": [0],
    "steps": 2,
    "probe": 4,
    "sft_steps": 2,
    "copy_steps": 2,
    "sft_experts": 16,
    "dataset_size": 16,
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


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


def arm_spec(doc: dict[str, Any], arm: str) -> dict[str, Any]:
    """``doc`` with the arm's algorithm settings merged into ``spec.algorithm``."""
    out = json.loads(json.dumps(doc))
    out["spec"]["algorithm"] = _merge(out["spec"].get("algorithm", {}), ARMS[arm])
    return out


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


# ------------------------------------------------------------------ per run
STEP_KEYS = (
    "pass_rate",
    "bloated_passes_ratio",
    "response_tokens_mean",
    "turns_mean",
    "gradient_variance",
    "gradient_mean_norm",
    "trained_groups",
    "eligible_groups_ratio",
    "step_seconds",
)


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def step_series(records: list[StepRecord]) -> dict[str, list[float | None]]:
    """Per-step series of one run. A step without a gradient has no variance (None), and the
    bloated share exists only where the step's groups were graded (``graded_by``): GRPO's groups
    are graded for measurement once the trainer grades them; before that it is None, not 0."""
    out: dict[str, list[float | None]] = {k: [] for k in STEP_KEYS}
    out["scale_free_variance"] = []
    for r in records:
        trained = r.grading.trained_groups > 0
        for key in STEP_KEYS:
            value = field_value(r, key)
            if key in ("gradient_variance", "gradient_mean_norm") and not trained:
                value = None
            if key == "bloated_passes_ratio" and not r.grading.graded_by:
                value = None
            out[key].append(value)
        norm, var = r.learner.gradient_mean_norm or 0.0, r.learner.gradient_variance
        scaled = var / norm**2 if trained and var is not None and norm > 0 else None
        given = r.learner.gradient_variance_scaled
        out["scale_free_variance"].append(given if given is not None else scaled)
    return out


def _probe_tokens(probe: dict[str, Any]) -> float:
    valid = [s["tokens"] for s in probe.get("samples", []) if s["valid"]]
    return statistics.fmean(valid) if valid else math.nan


def summarize(series: dict[str, list[Any]], probe: dict[str, Any]) -> dict[str, float]:
    """The per-run numbers the arms are compared on (``METRICS``)."""
    passes = [v for v in series["pass_rate"] if v is not None]
    k = max(1, min(5, len(passes) // 2))
    start, end = probe.get("start") or {}, probe.get("end") or {}
    start_tokens, end_tokens = _probe_tokens(start), _probe_tokens(end)

    def num(value: Any) -> float:
        return math.nan if value is None else float(value)

    return {
        "pass_rate_area": _mean(passes),
        "pass_rate_last": _mean(passes[-k:]),
        "probe_start": num(start.get("pass_rate")),
        "probe_end": num(end.get("pass_rate")),
        "probe_gain": num(end.get("pass_rate")) - num(start.get("pass_rate")),
        "probe_bloated_share": num(end.get("bloated_pass_share"))
        if end.get("passes")
        else math.nan,
        "train_bloated_share": _mean(series["bloated_passes_ratio"]),
        "tokens_per_pass": num(end.get("tokens_per_pass")),
        "turns_per_pass": num(end.get("turns_per_pass")),
        "probe_length_growth": end_tokens / start_tokens if start_tokens else math.nan,
        "gradient_variance": _mean(series["gradient_variance"]),
        "scale_free_variance": _mean(series["scale_free_variance"]),
        "step_seconds": _mean(series["step_seconds"]),
    }


METRICS = {  # key: (label, format)
    "pass_rate_area": ("training pass rate, mean over steps (area)", "{:.3f}"),
    "pass_rate_last": ("training pass rate, last 5 steps", "{:.3f}"),
    "probe_start": ("probe pass rate at the start", "{:.3f}"),
    "probe_end": ("probe pass rate at the end", "{:.3f}"),
    "probe_gain": ("probe pass rate, end − start", "{:+.3f}"),
    "probe_bloated_share": ("bloated share of probe passes (end)", "{:.2f}"),
    "train_bloated_share": ("bloated share of training passes", "{:.2f}"),
    "tokens_per_pass": ("tokens per passing probe sample (end)", "{:.0f}"),
    "turns_per_pass": ("turns per passing probe sample (end)", "{:.1f}"),
    "probe_length_growth": ("length growth on the probe (end / start)", "{:.3f}×"),
    "gradient_variance": ("gradient variance, raw", "{:.3g}"),
    "scale_free_variance": ("gradient variance / ‖mean gradient‖²", "{:.3g}"),
    "step_seconds": ("step time, s", "{:.1f}"),
}
TESTED = [k for k in METRICS if k not in ("probe_start", "step_seconds")]


def read_run(out: Path) -> dict[str, Any]:
    records = read_records(out / "metrics.jsonl")
    report = json.loads((out / "report.json").read_text())
    return {"records": records, "report": report}


def run_record(out: Path, seed: int, arm: str, seconds: float) -> dict[str, Any]:
    run = read_run(out)
    series = step_series(run["records"])
    probe = run["report"].get("probe") or {}
    return {
        "seed": seed,
        "arm": arm,
        "wall_seconds": seconds,
        "steps": series,
        "probe": probe,
        "summary": summarize(series, probe),
    }


# ------------------------------------------------------------------ statistics
def _by_seed(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in runs}


def _probe_pairs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[float]:
    """Per probe sample, pooled over the seeds both arms finished: passed(a) − passed(b) at the end."""
    diffs: list[float] = []
    ra, rb = _by_seed(a), _by_seed(b)
    for seed in sorted(ra.keys() & rb.keys()):
        sa = (ra[seed]["probe"].get("end") or {}).get("samples", [])
        sb = (rb[seed]["probe"].get("end") or {}).get("samples", [])
        diffs += [
            float(x["passed"]) - float(y["passed"])
            for x, y in zip(sa, sb, strict=False)
            if x["valid"] and y["valid"]
        ]
    return diffs


def _holm(tests: dict[str, Any]) -> None:
    """``p_holm`` on every test in ``tests`` (each metric's and each ``vs`` arm's): Holm over all
    of them, the family a reader scans."""
    family = [t for t in tests.values() if "p_value" in t]
    family += [v for t in tests.values() for v in t.get("vs", {}).values()]
    for t, p in zip(family, stats.holm([t["p_value"] for t in family]), strict=True):
        t["p_holm"] = p


def compare(arms: dict[str, list[dict[str, Any]]], baseline: str = "grpo") -> dict[str, Any]:
    """``tests[metric]``: ``gagar`` vs ``baseline`` paired over seeds (the unit: a step series
    enters as its per-run summary, never step by step), every other arm under ``vs``, ``p_holm``
    over all of them. Probe samples are only counted (``probe_end_discordant``): the samples of
    one run share its weights, so they are not independent units."""
    tests: dict[str, Any] = {}
    base = _by_seed(arms.get(baseline, []))
    others = [a for a in arms if a != baseline]
    for metric in TESTED:
        per_arm = {}
        for arm in others:
            mine = _by_seed(arms[arm])
            seeds = sorted(mine.keys() & base.keys())
            per_arm[arm] = stats.paired(
                [mine[s]["summary"][metric] for s in seeds],
                [base[s]["summary"][metric] for s in seeds],
            )
        main = per_arm.get("gagar", stats.paired([], []))
        tests[metric] = {**main, "vs": {a: t for a, t in per_arm.items() if a != "gagar"}}
    discordant = {arm: _probe_pairs(arms[arm], arms.get(baseline, [])) for arm in others}
    tests["probe_end_discordant"] = {  # descriptive: one run's samples share its weights
        arm: {"only_arm": sum(d > 0 for d in ds), "only_baseline": sum(d < 0 for d in ds)}
        for arm, ds in discordant.items()
    }
    _holm(tests)
    return tests


def arm_summary(arms: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {
        arm: {k: stats.mean_ci95([r["summary"][k] for r in runs]) for k in METRICS}
        for arm, runs in arms.items()
    }


# ------------------------------------------------------------------ outputs
def _fmt(fmt: str, value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else fmt.format(value)


def markdown(summary: dict[str, Any], tests: dict[str, Any], replay: dict[str, Any] | None) -> str:
    """The outcome table the README quotes: mean [95 % interval] per arm, p of each arm vs GRPO."""
    arms = list(summary)
    head = "| metric | " + " | ".join(arms) + " | p (gagar vs grpo) |"
    lines = [head, "|" + "---|" * (len(arms) + 2)]
    for key, (label, fmt) in METRICS.items():
        cells = []
        for arm in arms:
            m = summary[arm][key]
            plain = fmt.replace("+", "")
            band = (
                f" [{_fmt(plain, m['low']).rstrip('×')}, {_fmt(plain, m['high']).rstrip('×')}]"
                if math.isfinite(m["low"])
                else ""
            )
            cells.append(_fmt(fmt, m["mean"]) + band)
        test = tests.get(key)
        p = f"{test['p_value']:.2g}, Holm {test['p_holm']:.2g} (n={test['n']})" if test else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {p} |")
    d = tests.get("probe_end_discordant", {}).get("gagar")
    if d:
        lines.append(
            "| probe samples passed by gagar only / by grpo only (descriptive, not a test) | "
            + " | ".join("" for _ in arms)
            + f" | {d['only_arm']} / {d['only_baseline']} |"
        )
    if replay and replay.get("groups"):
        lines.append(
            f"| replay: Δ(log π best − worst pass), gagar vs grpo over {replay['groups']} groups | "
            + " | ".join(
                _fmt("{:.3g}", replay["means"][a]["gap_change"]["mean"])
                if a in replay.get("means", {})
                else ""
                for a in arms
            )
            + f" | {replay['p_value']:.2g} |"
        )
    return "\n".join(lines) + "\n"


def plots(arms: dict[str, list[dict[str, Any]]], folder: Path) -> list[str]:
    """One PNG per metric: per-step metrics over steps, probe metrics at start and end; a line per
    arm (mean over seeds) with its 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    per_step = ["pass_rate", "bloated_passes_ratio", "response_tokens_mean", "turns_mean"]
    per_step += ["gradient_variance", "scale_free_variance"]
    probe = {"probe_pass_rate": "pass_rate", "probe_tokens_per_pass": "tokens_per_pass"}
    probe["probe_bloated_share"] = "bloated_pass_share"
    for name in [*per_step, *probe]:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for arm, runs in arms.items():
            if name in probe:
                xs = [0, 1]
                cols = [
                    [(r["probe"].get(when) or {}).get(probe[name]) for r in runs]
                    for when in ("start", "end")
                ]
            else:
                width = max((len(r["steps"][name]) for r in runs), default=0)
                xs = list(range(1, width + 1))
                cols = [[r["steps"][name][i] if i < len(r["steps"][name]) else None for r in runs]
                        for i in range(width)]  # fmt: skip
            cis = [stats.mean_ci95([v for v in c if v is not None]) for c in cols]
            mean = [c["mean"] for c in cis]
            if all(not math.isfinite(m) for m in mean):
                continue
            (line,) = ax.plot(xs, mean, marker="o", label=arm)
            low = [c["low"] if math.isfinite(c["low"]) else c["mean"] for c in cis]
            high = [c["high"] if math.isfinite(c["high"]) else c["mean"] for c in cis]
            ax.fill_between(xs, low, high, alpha=0.2, color=line.get_color())
        if name in probe:
            ax.set_xticks([0, 1], ["start", "end"])
        else:
            ax.set_xlabel("RL step")
        ax.set_title(f"{name} (mean over seeds, 95 % band)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path.name)
    return written


def newest_replay(folder: Path) -> dict[str, Any] | None:
    found = sorted(folder.glob("gagar_replay-*.json"))
    if not found:
        return None
    data = json.loads(found[-1].read_text())
    return {
        **{k: data[k] for k in ("groups", "p_value", "means", "tests", "protocol")},
        "file": found[-1].name,
    }


def write_result(
    path: Path,
    protocol: dict[str, Any],
    arms: dict[str, list[dict[str, Any]]],
    failed: list[dict[str, Any]],
    replay: dict[str, Any] | None,
    *,
    finished: bool,
) -> dict[str, Any]:
    """The JSON, rewritten after every run: a bench stopped half-way keeps what it measured."""
    live = {a: rs for a, rs in arms.items() if rs}
    result = {
        "protocol": protocol,
        "arms": arms,
        "tests": compare(live) if "grpo" in live else {},
        "replay": replay or {"groups": 0, "p_value": None, "note": "bench/gagar_replay.py not run"},
        "summary": arm_summary(live),
        "finished": finished,
        "failed": failed,
        "machine": {"loadavg": os.getloadavg()},  # save adds the CPU and its cores
    }
    return save(path, result, indent=2)


# ------------------------------------------------------------------ main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--manifest", default=str(ROOT / "examples" / "gagar-vs-grpo.yaml"))
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--steps", type=int, help="RL steps per run (default: the manifest's)")
    p.add_argument("--probe", type=int, help="probe samples (default 64)")
    p.add_argument("--sft-steps", type=int, help="SFT steps (default: the manifest's)")
    p.add_argument("--sft-experts", type=int, help="SFT expert tasks (default: the manifest's)")
    p.add_argument("--copy-steps", type=int, help="tiny preset: copying curriculum steps")
    p.add_argument("--dataset-size", type=int, help="synthetic tasks (default: the manifest's)")
    p.add_argument("--quick", action="store_true", help="the pipeline in minutes: answers nothing")
    p.add_argument("--work", default=str(ROOT / "runs" / "gagar_vs_grpo"))
    day = datetime.date.today().isoformat()
    p.add_argument("--json", default=str(RESULTS / f"gagar_vs_grpo-{day}.json"))
    p.add_argument("--reuse-sft", action="store_true", help="reuse --work's finished warm start")
    p.add_argument(
        "--finish",
        action="store_true",
        help="only rewrite --json's table and plots, taking in the newest replay result",
    )
    args = p.parse_args(argv)
    defaults = {"seeds": [0, 1, 2], "probe": 64}
    for key, value in (QUICK if args.quick else defaults).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def warm_start(
    args: argparse.Namespace, sft_doc: dict[str, Any], work: Path, console: Any
) -> float | None:
    """The common start (its wall time; NaN when reused), or None when it failed."""
    if args.reuse_sft and (work / "sft" / "report.json").exists():
        console.print(f"[bold]warm start[/]: reusing {work / 'sft'}")
        return math.nan
    console.print(f"[bold]warm start[/] {args.sft_steps} SFT steps → {work / 'sft'}")
    try:
        return gagar_train(sft_doc, work / "sft", "--eval-only", "--eval-tasks", "0")
    except RunFailed as err:
        console.print(f"[red]the warm start failed[/]: {err}")
        return None


def finish(out_json: Path, console: Any) -> None:
    """The Markdown table and the plots from the JSON, with the newest replay result in it."""
    result = json.loads(out_json.read_text())
    result["replay"] = newest_replay(RESULTS) or result["replay"]
    live = {a: rs for a, rs in result["arms"].items() if rs}
    if "grpo" in live:  # the tests as this code computes them
        result["tests"] = compare(live)
        result["summary"] = arm_summary(live)
    out_json.write_text(json.dumps(result, indent=2))
    folder = out_json.with_suffix("")
    written = plots(live, folder)
    replay = result["replay"] if result["replay"].get("groups") else None
    table = markdown(result["summary"], result["tests"], replay)
    out_json.with_suffix(".md").write_text(table)
    console.print(table)
    console.print(
        f"wrote {out_json}, {out_json.with_suffix('.md')}, {len(written)} plots in {folder}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from rich.console import Console

    console = Console()
    if args.finish:
        finish(Path(args.json), console)
        return 0
    return run_arms(args, console)


def run_arms(args: argparse.Namespace, console: Any) -> int:
    """The warm start, then every seed and arm from it; the JSON after every run."""
    work = Path(args.work)
    base = yaml.safe_load(Path(args.manifest).read_text())
    spec = base["spec"]
    if args.steps is None:
        args.steps = spec["algorithm"].get("totalSteps", 1)
    if args.sft_steps is None:
        args.sft_steps = spec["model"].get("sftWarmupSteps", 0)
    if args.dataset_size is not None:
        spec["dataset"]["sources"] = [
            {**src, "size": args.dataset_size} if src.get("kind") == "synthetic" else src
            for src in spec["dataset"]["sources"]
        ]
    # same tasks in the same order in every arm: no extra sampling rounds that depend on outcomes
    spec["algorithm"]["dynamicSampling"] = {"enabled": False}
    model = {k: v for k, v in spec["model"].items() if k not in SFT_RUN_ONLY}
    sft_model = {**spec["model"], "sftWarmupSteps": args.sft_steps}
    for key, value in (
        ("sftExpertTasks", args.sft_experts),
        ("copyCurriculumSteps", args.copy_steps),
    ):
        if value is not None:
            sft_model[key] = value
    sft_doc = manifest(base, "sft", model=sft_model)
    t0 = time.perf_counter()
    sft_seconds = warm_start(args, sft_doc, work, console)
    if sft_seconds is None:
        return 1
    start = work / "sft-policy"
    if start.exists():
        shutil.rmtree(start)
    shutil.copytree(work / "sft" / "policy" / "serving", start)
    warm = json.loads((work / "sft" / "report.json").read_text()).get("warm_start")
    alg = spec["algorithm"]
    protocol = {
        "seeds": args.seeds,
        "steps": args.steps,
        "trajectories_per_step": alg.get("tasksPerStep", 8) * alg.get("groupSize", 8),
        "probe_samples": args.probe,
        # one start score for every run (the first run's, from the probe cache: same weights)
        "probe_start": "shared",
        "policy": {
            **{k: v for k, v in sft_doc["spec"]["model"].items() if k != "path"},
            "warm_start": warm,
            "warm_start_seconds": sft_seconds,
        },
        "arms": {a: ARMS[a] for a in args.arms},
        "manifest": os.path.relpath(args.manifest, ROOT),
        "dataset": spec["dataset"],
        "quick": args.quick,
        "date": datetime.date.today().isoformat(),
    }
    replay = newest_replay(RESULTS)
    arms: dict[str, list[dict[str, Any]]] = {a: [] for a in args.arms}
    failed: list[dict[str, Any]] = []
    out_json = Path(args.json)
    for seed in args.seeds:
        for arm in args.arms:
            doc = arm_spec(
                manifest(
                    base,
                    f"{arm}-s{seed}",
                    model={**model, "path": str(start), "sftWarmupSteps": 0},
                    algorithm__seed=seed,
                    algorithm__totalSteps=args.steps,
                ),
                arm,
            )
            out = work / f"{arm}-s{seed}"
            console.print(f"[bold]{arm}[/] seed {seed}: {args.steps} steps → {out}")
            try:
                seconds = gagar_train(doc, out, "--eval-tasks", "0", "--probe", str(args.probe))
            except RunFailed as err:  # kept out of the statistics, named in the JSON
                console.print(f"  [red]failed[/]: {err}")
                failed.append({"seed": seed, "arm": arm, "error": str(err)})
                continue
            record = run_record(out, seed, arm, seconds)
            arms[arm].append(record)
            s = record["summary"]
            console.print(
                f"  pass {s['pass_rate_area']:.3f} · probe {s['probe_start']:.3f} → "
                f"{s['probe_end']:.3f} · {seconds:.0f} s"
            )
            write_result(out_json, protocol, arms, failed, replay, finished=False)
    protocol["wall_seconds"] = time.perf_counter() - t0
    # the replay may have finished while the arms ran (it is a separate process)
    write_result(out_json, protocol, arms, failed, newest_replay(RESULTS), finished=True)
    finish(out_json, console)
    if failed:
        console.print(
            "failed, left out: " + ", ".join(f"{f['arm']} seed {f['seed']}" for f in failed)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
