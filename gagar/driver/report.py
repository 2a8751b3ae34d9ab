"""Per-step metrics: one ``StepRecord`` per step to ``metrics.jsonl`` and Prometheus, and the
final report.

The record holds the catalogue's trainer metrics (docs/design.md §4) for one step; the same
numbers go to Prometheus (``export``) and, at the end, into ``report.json`` and PNG plots.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from scipy.stats import binomtest, fisher_exact

from gagar.driver.record import StepRecord, StepSamples, field_value
from gagar.metrics import ADV_STAGES, STAGES, THROUGHPUT_STAGES, Metrics

# Prometheus gauge → the record's value (None: the step has none, the gauge keeps its last value)
GAUGES: dict[str, Callable[[StepRecord], float | None]] = {
    "gagar_trainer_step": lambda r: r.step,
    "gagar_policy_version": lambda r: r.policy_version,
    "gagar_rollout_staleness_versions": lambda r: r.staleness_versions,
    "gagar_pass_rate_ratio": lambda r: r.rollouts.pass_rate,
    "gagar_eligible_groups_ratio": lambda r: r.eligible_groups_ratio,
    "gagar_lambda_mean": lambda r: r.grading.lambda_mean,
    "gagar_bloated_passes_ratio": lambda r: r.grading.bloated_passes_ratio,
    "gagar_loss": lambda r: r.learner.loss,
    "gagar_kl": lambda r: r.learner.kl,
    "gagar_entropy": lambda r: r.learner.entropy,
    "gagar_clip_ratio": lambda r: r.learner.clip_ratio,
    "gagar_grad_norm": lambda r: r.learner.grad_norm,
    "gagar_gradient_variance": lambda r: r.learner.gradient_variance,
    "gagar_gradient_variance_scaled": lambda r: r.learner.gradient_variance_scaled,
    "gagar_learning_rate": lambda r: r.learner.lr,
    "gagar_clip_low_ratio": lambda r: r.learner.clip_low_ratio,
    "gagar_clip_high_ratio": lambda r: r.learner.clip_high_ratio,
    "gagar_clip_dual_ratio": lambda r: r.learner.clip_dual_ratio,
    "gagar_importance_ratio_mean": lambda r: r.learner.ratio_mean,
    "gagar_importance_ratio_max": lambda r: r.learner.ratio_max,
    "gagar_gradient_mean_norm": lambda r: r.learner.gradient_mean_norm,
    "gagar_gradient_noise_scale": lambda r: r.learner.gradient_noise_scale,
    "gagar_gradient_noise_trace": lambda r: r.learner.gradient_noise_trace,
    "gagar_gradient_signal_sq": lambda r: r.learner.gradient_signal_sq,
    "gagar_checkpoint_step": lambda r: r.checkpoint_step,
}


def summarize(values: Iterable[float]) -> dict[str, float]:
    vals = list(values)
    if not vals:
        return {"mean": 0.0, "std": 0.0, "abs_max": 0.0}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.pstdev(vals),
        "abs_max": max(abs(v) for v in vals),
    }


def append_jsonl(path: Path, record: StepRecord) -> None:
    with open(path, "a") as fh:
        fh.write(record.to_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def rewrite_last_jsonl(path: Path, record: StepRecord) -> None:
    """Replace the last record (that of the same step) by ``record``: a new file, fsync'ed, then
    renamed over the old one, so a kill leaves the old record or the new one."""
    lines = path.read_text().splitlines()
    if not lines or json.loads(lines[-1]).get("step") != record.step:
        raise ValueError(f"{path}: the last record is not that of step {record.step}")
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        fh.write("\n".join([*lines[:-1], record.to_json()]) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def export(metrics: Metrics, run: str, record: StepRecord, samples: StepSamples) -> None:
    """Push one step's record (and its per-trajectory values) to Prometheus."""
    for name, value_of in GAUGES.items():
        value = value_of(record)
        if value is not None:
            metrics.gauge(name).labels(run=run).set(float(value))
    metrics.histogram("gagar_trainer_step_duration_seconds").labels(run=run).observe(
        record.step_seconds
    )
    stages = record.stage_seconds.model_dump()
    for stage in STAGES:  # they add up to step_seconds
        metrics.histogram("gagar_trainer_stage_duration_seconds").labels(
            run=run, stage=stage
        ).observe(stages[stage])
    advantages = {"before": record.grading.adv_before, "after": record.grading.adv_after}
    per_trajectory = {"before": samples.adv_before, "after": samples.adv_after}
    for stage in ADV_STAGES:
        for stat, value in advantages[stage].model_dump().items():
            metrics.gauge(f"gagar_advantage_{stat}").labels(run=run, stage=stage).set(value)
        for value in per_trajectory[stage]:
            metrics.histogram("gagar_advantage").labels(run=run, stage=stage).observe(value)
    throughput = {
        "rollout": record.rollout_tokens_per_second,
        "training": record.training_tokens_per_second,
    }
    for stage in THROUGHPUT_STAGES:
        metrics.gauge("gagar_tokens_per_second").labels(run=run, stage=stage).set(throughput[stage])
    _counters(metrics, run, record, samples)


def _counters(metrics: Metrics, run: str, record: StepRecord, samples: StepSamples) -> None:
    metrics.counter("gagar_sampling_rounds_total").labels(run=run).inc(record.sampling_rounds)
    metrics.counter("gagar_quota_shortfall_total").labels(run=run).inc(1 if record.shortfall else 0)
    metrics.counter("gagar_hacks_total").labels(run=run).inc(record.grading.hacks)
    metrics.counter("gagar_tokens_trained_total").labels(run=run).inc(record.learner.tokens_trained)
    g = record.grading
    for name, count in (
        ("gagar_grader_usable_groups_total", g.usable_groups),
        ("gagar_grader_heuristic_pairs_total", g.heuristic_pairs),
        ("gagar_grader_heuristic_agreeing_pairs_total", g.heuristic_agreeing_pairs),
        ("gagar_grader_audited_groups_total", g.audited_groups),
        ("gagar_grader_audit_pairs_total", g.audit_pairs),
        ("gagar_grader_audit_consistent_pairs_total", g.audit_consistent_pairs),
    ):
        metrics.counter(name).labels(run=run).inc(count)
    for reason, count in record.grading.fallbacks.items():
        metrics.counter("gagar_grader_fallbacks_total").labels(run=run, reason=reason).inc(count)
    for reason, count in record.rollouts.invalid.items():
        metrics.counter("gagar_invalid_trajectories_total").labels(run=run, reason=reason).inc(
            count
        )
    verdicts = {"run": record.rollouts.verifications, "shared": record.rollouts.verdicts_shared}
    for outcome, count in verdicts.items():
        metrics.counter("gagar_verifications_total").labels(run=run, outcome=outcome).inc(count)
    for kind, count in record.rollouts.flagged_turns.model_dump().items():
        metrics.counter("gagar_redundant_actions_total").labels(run=run, kind=kind).inc(count)
    histograms: dict[str, list[float] | list[int]] = {
        "gagar_lambda": samples.lambdas,
        "gagar_quality_factor": samples.factors,
        "gagar_response_tokens": samples.response_tokens,
        "gagar_turns": samples.turns,
    }
    for name, values in histograms.items():
        for value in values:
            metrics.histogram(name).labels(run=run).observe(value)


PLOTS = {
    "pass_rate.png": (("pass_rate",), "pass rate (training rollouts)"),
    "length.png": (
        ("response_tokens_mean", "turns_mean"),
        "response tokens and turns per trajectory",
    ),
    "bloat.png": (("bloated_passes_ratio",), "share of passes graded below T1"),
    "lambda.png": (("lambda_mean",), "mean λ of redistributed groups"),
    "gradient_variance.png": (("gradient_variance",), "tr Cov of micro-batch gradients"),
    "gradient_noise_scale.png": (
        ("gradient_noise_scale",),
        "gradient noise scale B = tr Σ / ‖G‖² (tokens)",
    ),
    "learning.png": (
        ("lr", "kl", "clip_ratio", "ratio_max"),
        "learning rate, KL to the reference, clipped share, max importance ratio",
    ),
    "advantages.png": (
        ("adv_before_abs_max", "adv_after_abs_max", "adv_before_std", "adv_after_std"),
        "advantages before/after redistribution",
    ),
}


def series(records: list[StepRecord], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the record's field ``key`` (a flat name: ``pass_rate``,
    ``adv_after_std``); a step without it (e.g. no gradient variance: it trained nothing, or on
    one micro-batch) is left out, not drawn as 0. A key the record does not have: ``KeyError``."""
    values = [(r.step, field_value(r, key)) for r in records]
    have = [(step, v) for step, v in values if v is not None]
    return [step for step, _ in have], [v for _, v in have]


STAGES_PLOT = "stages.png"


def _stage_bars(plt: Any, path: Path, records: list[StepRecord]) -> None:
    """Where each step's time went: one stacked bar per step, a segment per stage."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r.step for r in records]
    bottom = [0.0] * len(records)
    for stage in STAGES:
        height = [float(r.stage_seconds.model_dump()[stage]) for r in records]
        ax.bar(steps, height, bottom=bottom, label=stage)
        bottom = [b + h for b, h in zip(bottom, height, strict=True)]
    ax.set_title("step time by stage, s")
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, records: list[StepRecord], summary: dict[str, Any]) -> dict[str, Any]:
    """``report.json`` (summary + first/last records) and one PNG per plot in ``PLOTS``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, (keys, title) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            ax.plot(*series(records, key), marker="o", label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
    _stage_bars(plt, out / STAGES_PLOT, records)
    report = {
        **summary,
        "steps": len(records),
        "first": records[0].flat() if records else None,
        "last": records[-1].flat() if records else None,
        "plots": sorted([*PLOTS, STAGES_PLOT]),
        "gradient_noise_scale_pooled": pooled_noise_scale(records),
        "grader_quality": grader_quality(records),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _trend(records: list[StepRecord], key: str, k: int = 5, fmt: str = ".2f") -> str:
    """``first k → last k`` means of a per-step value (steps that lack it are skipped)."""
    vals = series(records, key)[1]
    if not vals:
        return "–"
    head, tail = vals[:k], vals[-k:]
    if len(vals) <= k:
        return f"{statistics.fmean(vals):{fmt}}"
    return f"{statistics.fmean(head):{fmt}} → {statistics.fmean(tail):{fmt}}"


def grader_quality(records: list[StepRecord]) -> dict[str, Any]:
    """The grader's quality over the run (``gagar.grader.quality``): each share as the pooled
    counts behind it (``of``: groups or pairs) and their ratio, None where nothing was counted."""

    def share(alike: str, compared: str) -> dict[str, Any]:
        x = sum(getattr(r.grading, alike) for r in records)
        n = sum(getattr(r.grading, compared) for r in records)
        return {"count": x, "of": n, "ratio": x / n if n else None}

    graded = [(r.grading.usable_groups, sum(r.grading.graded_by.values())) for r in records]
    usable, groups = sum(x for x, _ in graded), sum(n for _, n in graded)
    return {
        "usable": {"count": usable, "of": groups, "ratio": usable / groups if groups else None},
        "heuristic_agreement": share("heuristic_agreeing_pairs", "heuristic_pairs"),
        "audit_consistency": share("audit_consistent_pairs", "audit_pairs"),
        "audited_groups": sum(r.grading.audited_groups for r in records),
        "audit_unusable": sum(r.grading.audit_unusable for r in records),
    }


def pooled_noise_scale(records: list[StepRecord]) -> float | None:
    """B over the run: mean tr Σ / mean ‖G‖² over the steps that have both (McCandlish's advice:
    one step's ‖G‖² estimate is noisy and can be ≤ 0); None when the pooled ‖G‖² is ≤ 0 too."""
    pairs = [
        (trace, signal)
        for r in records
        if (trace := r.learner.gradient_noise_trace) is not None
        and (signal := r.learner.gradient_signal_sq) is not None
    ]
    pooled_signal = sum(signal for _, signal in pairs)
    if not pairs or pooled_signal <= 0:
        return None
    return sum(trace for trace, _ in pairs) / pooled_signal


def _noise_row(records: list[StepRecord]) -> str:
    steps = sum(r.learner.gradient_noise_trace is not None for r in records)
    if not steps:
        return "–"
    b = pooled_noise_scale(records)
    if b is None:
        return f"undefined: pooled ‖G‖² ≤ 0 over {steps} steps (noise dominates)"
    return f"{b:.3g} (tr Σ and ‖G‖² pooled over {steps} steps)"


Counts = Callable[[StepRecord], tuple[int, int]]


def _pooled(records: list[StepRecord], counts: Counts) -> tuple[int, int]:
    """Counts pooled over steps (Σx of Σn)."""
    pairs = [counts(r) for r in records]
    return sum(x for x, _ in pairs), sum(n for _, n in pairs)


def _rate(x: int, n: int) -> str:
    """``x/n = 0.25 [0.15, 0.38]``: the share and its exact (Clopper-Pearson) 95 % interval."""
    if n == 0:
        return "0/0"
    ci = binomtest(x, n).proportion_ci(0.95, method="exact")
    return f"{x}/{n} = {x / n:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def _verdict(p: float) -> str:
    return f"within noise, p = {p:.2g}" if p >= 0.05 else f"p = {p:.2g}"


def _pooled_trend(records: list[StepRecord], counts: Counts, k: int) -> str:
    """First k steps' pooled share → last k steps', each with its interval, and Fisher's exact
    test of the two (trajectories of a group share a task, so read p as optimistic)."""
    head, tail = _pooled(records[:k], counts), _pooled(records[-k:], counts)
    if not _pooled(records, counts)[1]:
        return "–"  # nothing to count (no pass was graded)
    if len(records) <= k:
        return _rate(*head)
    (x1, n1), (x2, n2) = head, tail
    if n1 == 0 or n2 == 0:
        return f"{_rate(x1, n1)} → {_rate(x2, n2)}"
    p = fisher_exact([[x1, n1 - x1], [x2, n2 - x2]]).pvalue
    return f"{_rate(x1, n1)} → {_rate(x2, n2)} ({_verdict(float(p))})"


def _probe_change(start: dict[str, Any], end: dict[str, Any]) -> str:
    """Probe start → end: pooled counts with intervals, and the exact sign (McNemar) test on the
    samples that changed (the same samples and seeds at both ends)."""
    pairs = [
        (a["passed"], b["passed"])
        for a, b in zip(start.get("samples") or [], end.get("samples") or [], strict=False)
        if a.get("valid") and b.get("valid")
    ]
    if not pairs:
        return f"{start['pass_rate']:.2f} → {end['pass_rate']:.2f} ({end['valid']} samples)"
    x1, x2, n = sum(a for a, _ in pairs), sum(b for _, b in pairs), len(pairs)
    gained = sum(b and not a for a, b in pairs)
    lost = sum(a and not b for a, b in pairs)
    p = binomtest(gained, gained + lost).pvalue if gained + lost else 1.0
    return f"{_rate(x1, n)} → {_rate(x2, n)}; {gained} gained, {lost} lost ({_verdict(float(p))})"


def summary_rows(report: dict[str, Any], records: list[StepRecord]) -> list[tuple[str, str]]:
    """The final summary a person reads: (what, value) rows, numbers formatted, no raw dicts."""
    rows = [("run", f"{report['run']} ({report['mode']}), policy v{report['policy_version']}")]
    warm = report.get("warm_start") or {}
    copy = warm.get("copy_curriculum") or {}
    sft = {k: warm.get(f"sft_{k}") for k in ("steps", "nll_first", "nll_last")}
    cached = " (cached on this machine)" if warm.get("cached") else ""
    for name, part in (("copy curriculum", copy), ("SFT warm start" + cached, sft)):
        if part.get("steps"):
            rows.append(
                (
                    name,
                    f"{part['steps']} steps, NLL/token {part['nll_first']:.2f} → {part['nll_last']:.2f}",
                )
            )
    if precision := report.get("precision"):
        rows.append(("compute dtype", f"{precision['dtype']} ({precision['reason']})"))
    rows.append(("RL steps", str(report["steps"])))
    if records:
        k = min(5, max(1, len(records) // 2))
        rows += [
            (
                f"training pass rate (first {k} → last {k} steps)",
                _pooled_trend(
                    records, lambda r: (r.rollouts.passes, r.rollouts.valid_trajectories), k
                ),
            ),
            (
                "bloated share of passes",
                _pooled_trend(
                    records, lambda r: (r.grading.bloated_passes, r.grading.graded_passes), k
                ),
            ),
            ("response tokens per trajectory", _trend(records, "response_tokens_mean", k, ".0f")),
            ("step time, s", f"{statistics.fmean(r.step_seconds for r in records):.1f} mean"),
            ("gradient noise scale, tokens", _noise_row(records)),
            *_grader_rows(records),
        ]
    probe = report.get("probe") or {}
    if probe.get("start") and probe.get("end"):
        start, end = probe["start"], probe["end"]
        # short name: a longer one wraps on 80 columns
        rows.append(("probe pass rate (start → end)", _probe_change(start, end)))
    held = report.get("held_out") or {}
    if held.get("tasks"):
        solved = round(held["resolution_rate"] * held["valid"])
        rows.append(("held-out resolved", _rate(solved, held["valid"])))
        rows += [(f"  {pkg}", rate) for pkg, rate in _package_rates(held.get("samples") or [])]
        rows.append(("held-out response tokens", f"{held['response_tokens_mean']:.0f}"))
    return rows


def _grader_rows(records: list[StepRecord]) -> list[tuple[str, str]]:
    """The grader's own rankings among the graded groups (usable: neither a fallback nor
    unusable), which graders ranked them and the fallbacks by reason; with an agentic grader,
    its agreement with the heuristic on the same groups' pairs of passes."""
    quality = grader_quality(records)
    usable = quality["usable"]
    if not usable["of"]:
        return []  # no group had passes to rank
    by = Counter[str]()
    fallbacks = Counter[str]()
    for r in records:
        by.update(r.grading.graded_by)
        fallbacks.update(r.grading.fallbacks)
    graded = ", ".join(f"{name} {n}" for name, n in by.most_common())
    fell = ", ".join(f"{reason} {n}" for reason, n in fallbacks.most_common()) or "none"
    rows = [
        ("grader rankings usable", _rate(usable["count"], usable["of"])),
        ("  graded by · fallbacks", f"{graded} · {fell}"),
    ]
    if (agree := quality["heuristic_agreement"])["of"]:
        rows.append(("  pairs ordered as the heuristic", _rate(agree["count"], agree["of"])))
    return rows


def _package_rates(samples: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(package, resolved with its interval) of mined held-out tasks (``metadata.package``),
    by package: the held-out split is whole packages, so this is where a policy generalises."""
    valid: dict[str, list[bool]] = {}
    for sample in samples:
        if sample.get("package") is not None and sample.get("valid"):
            valid.setdefault(str(sample["package"]), []).append(bool(sample["passed"]))
    return [(pkg, _rate(sum(ok), len(ok))) for pkg, ok in sorted(valid.items())]
