"""Gradient noise scale of GAGAR vs GRPO at fixed weights, on the mechanism task.

At fixed policy weights (``POINTS``: the uniform start, and a policy drifted to bloated passes the
way GRPO's runs drift), draw R independent batches (8 tasks × groups of 8, eligible groups only);
for each batch both arms see the SAME rollouts and rankings and differ only in their advantages.
Each batch's gradient is accumulated over 4 micro-batches of whole groups (prompt-mean, the
default) through the trainer's own ``GradVarianceTracker`` (``gagar/trainer/gradvar.py``), each
micro-batch weighted by its prompt share. The groups are independent, identically distributed draws
and a micro-batch's share does not depend on the draw, so tr Σ (N · tr Cov(ḡ)) and ‖G‖² per batch
are unbiased here with no assumption on token counts; B = mean tr Σ / mean ‖G‖² over the batches
(McCandlish's advice: average numerator and denominator before dividing; a ratio, consistent, not
unbiased). Files before 2026-12-07 used the estimator issue 50 found biased under prompt-mean. The batch is the independent unit here; the 95 % interval of
B(gagar) / B(grpo) is a paired bootstrap over batches (``scipy.stats.bootstrap``), the p-value
a paired permutation test over batches (each batch's arms swapped or not), Holm over the rows.

    .venv/bin/python bench/mechanism_noise.py [--batches 300] [--out docs/results/mechanism_noise-<date>.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import mechanism as m  # noqa: E402
from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.trainer.gradvar import GradVarianceTracker  # noqa: E402
from gagar.trainer.loss import (  # noqa: E402
    LossConfig,
    PolicyBatch,
    aggregation_weight,
    policy_loss,
)

ARMS = ("grpo", "gagar")
MICRO = 4
# style probabilities (clean, bloated, redundant, wrong) on easy and hard tasks
POINTS = {
    "uniform": [[0.25] * 4, [0.25] * 4],
    "bloat-drifted": [[0.2, 0.5, 0.15, 0.15], [0.2, 0.5, 0.15, 0.15]],
}


def _rows(batch: PolicyBatch, rows: slice) -> PolicyBatch:
    return PolicyBatch(
        logp=batch.logp[rows], old_logp=batch.old_logp[rows], adv=batch.adv[rows],
        mask=batch.mask[rows], prompt_tokens=batch.prompt_tokens[rows],  # type: ignore[index]
    )  # fmt: skip


def batch_noise(
    groups: list[m.Group], token_adv: list[list[float]], logits: torch.nn.Parameter
) -> tuple[float, float]:
    """(tr Σ, ‖G‖²) of one batch: the loss accumulated over MICRO micro-batches of whole
    groups, global normalisation, the trainer's tracker."""
    logits.grad = None
    tracker = GradVarianceTracker([logits])
    n = len(groups[0].styles)
    bounds = np.linspace(0, len(groups), MICRO + 1).round().astype(int)
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        full, counts = m._step_batch(groups, token_adv, logits)
        part = _rows(full, slice(int(a) * n, int(b) * n))
        loss, _ = policy_loss(part, counts, LossConfig())
        loss.backward()
        tracker.after_micro_batch(
            aggregation_weight(part.mask, counts, LossConfig(), part.prompt_tokens)
        )
    trace, signal, _ = tracker.noise(counts.num_tokens)
    return trace, signal


def measure(point: str, q: float, bonus: float, batches: int, seed: int = 0) -> dict[str, Any]:
    task = m.Task().with_bonus(bonus)
    probs = np.array(POINTS[point])
    logits = torch.nn.Parameter(torch.log(torch.tensor(probs, dtype=torch.float64)))
    rng = np.random.default_rng([seed, 11])
    sigma = m.grader_sigma(q)
    out: dict[str, list[tuple[float, float]]] = {a: [] for a in ARMS}
    while len(out["grpo"]) < batches:
        hard = rng.random(8) < task.hard_share
        groups = [m.sample_group(probs[int(h)], bool(h), 8, task, rng) for h in hard]
        groups = [g for g in groups if 0 < sum(r.passed for r in g.rollouts) < 8]
        if len(groups) < MICRO:  # fewer groups than micro-batches: no two batch sizes
            continue
        passed = [[r.passed for r in g.rollouts] for g in groups]
        rankings = [
            m.grade(g.styles, p, g.hacked, sigma, task, rng)
            for g, p in zip(groups, passed, strict=True)
        ]
        for arm in ARMS:
            out[arm].append(batch_noise(groups, m.ARM_FNS[arm](groups, rankings), logits))
    data = {a: np.array(v) for a, v in out.items()}  # (R, 2): trace, signal

    def ratio(tg: Any, sg: Any, ta: Any, sa: Any, axis: int = -1) -> Any:
        return (np.mean(ta, axis) / np.mean(sa, axis)) / (np.mean(tg, axis) / np.mean(sg, axis))

    cols = (data["grpo"][:, 0], data["grpo"][:, 1], data["gagar"][:, 0], data["gagar"][:, 1])
    boot = st.bootstrap(cols, ratio, paired=True, vectorized=True, n_resamples=2000, rng=seed)
    # paired permutation over batches: each batch's two arms swapped or not (H0: exchangeable)
    both = np.concatenate([data["grpo"], data["gagar"]])
    r = len(data["grpo"])

    def log_ratio(x: Any, y: Any, axis: int = -1) -> Any:
        tx, sx = both[x, 0].mean(axis), both[x, 1].mean(axis)
        ty, sy = both[y, 0].mean(axis), both[y, 1].mean(axis)
        ok = (tx > 0) & (sx > 0) & (ty > 0) & (sy > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.log(np.where(ok, (ty / sy) / (tx / sx), 1.0))
        return np.where(ok, value, np.inf)  # B undefined: counted as extreme

    perm = st.permutation_test(
        (np.arange(r), np.arange(r, 2 * r)), log_ratio, permutation_type="samples",
        vectorized=True, n_resamples=4999, rng=seed,
    )  # fmt: skip
    arms = {
        a: {
            "trace_sigma": float(d[:, 0].mean()),
            "grad_sq_norm": float(d[:, 1].mean()),
            "noise_scale_tokens": float(d[:, 0].mean() / d[:, 1].mean()),
        }
        for a, d in data.items()
    }
    return {
        "point": point, "q": q, "bonus": bonus, "batches": batches, "arms": arms,
        "ratio_gagar_over_grpo": float(ratio(*cols)),
        "ratio_ci95": [float(boot.confidence_interval.low), float(boot.confidence_interval.high)],
        # an undefined B (pooled ‖G‖² ≤ 0) in either arm: no test (not a p of 0)
        "p_value": float(perm.pvalue)
        if np.isfinite(log_ratio(np.arange(r), np.arange(r, 2 * r)))
        else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or ROOT / "docs" / "results" / f"mechanism_noise-{dt.date.today()}.json"
    start = time.monotonic()
    rows = [
        measure(point, q, b, args.batches)
        for point in POINTS
        for q, b in ((1.0, 0.0), (0.6, 0.1))
    ]  # fmt: skip
    family = [r for r in rows if r["p_value"] is not None]
    for r, p in zip(family, stats.holm([r["p_value"] for r in family]), strict=True):
        r["p_holm"] = p
    print("point          q    b    B grpo   B gagar  gagar/grpo [95 % CI]  p  p_holm")
    for r in rows:
        g, a = r["arms"]["grpo"], r["arms"]["gagar"]
        lo, hi = r["ratio_ci95"]
        print(
            f"{r['point']:<14} {r['q']:<4} {r['bonus']:<4} {g['noise_scale_tokens']:8.1f} "
            f"{a['noise_scale_tokens']:8.1f}  {r['ratio_gagar_over_grpo']:.3f} [{lo:.3f}, {hi:.3f}]  "
            + (
                f"{r['p_value']:.2g}  {r['p_holm']:.2g}"
                if r["p_value"] is not None
                else "undefined"
            )
        )
    result = {
        "bench": "mechanism_noise",
        "protocol": {
            "points": POINTS,
            "micro_batches": MICRO,
            "batches": args.batches,
            "unit": "batch (independent draws at fixed weights; both arms on the same rollouts)",
            "estimator": "B = mean tr Σ / mean ‖G‖² from GradVarianceTracker.noise per batch "
            "(units weighted by their aggregation share; unbiased parts, issue 50)",
            "interval": "paired bootstrap over batches (scipy.stats.bootstrap, BCa, 2000)",
            "p_value": "paired permutation over batches (arms swapped per batch; "
            "scipy.stats.permutation_test, 4999), two-sided; Holm over the rows (p_holm)",
        },
        "rows": rows,
        "elapsed_seconds": round(time.monotonic() - start, 1),
    }
    save(out, result, indent=1)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
