"""Mechanism test: does GAGAR's grader-guided advantage move a policy away from bloated passes,
and at what cost in pass rate, as the grader's accuracy falls?

A simulated agentic task whose solution *styles* have set pass probabilities, lengths and tool-call
profiles, a simulated grader of pairwise accuracy ``q``, and a small policy (softmax logits over
the styles, one row per task type) trained with the project's own code: the driver's
``group_advantages``/``token_advantages`` (GAGAR mode and the GRPO baseline, exactly what the
trainer runs), ``gar.length_penalty``/``gar.grpo_advantages`` for the plain length-penalty control,
and ``loss.policy_loss`` (PPO clip, prompt-mean aggregation) for the update.

Styles (lengths in simulated tokens, one = 10 real tokens; pass probability easy / hard task):

    clean      30 tokens, 4 tool calls            0.70 / 0.30
    bloated    70 tokens, 5 tool calls            0.70 + b / 0.30 + b   (b: the bloated-pass bonus)
    redundant  60 tokens, 8 tool calls, 4 of them flagged as redundant   0.65 / 0.25
    wrong      25 tokens, 3 tool calls            never correct; games the tests with p 0.30

The grader sees every pass of an eligible group: a gamed pass is confirmed as a hack with
probability 0.7; the others get a score = quality + σ·N(0, 1) (quality: clean 1, redundant 0.4,
bloated 0, undetected hack −0.5) with σ chosen so that P(clean scored above bloated) = q; tiers
by score (≥ 0.5 T1, ≥ −0.25 T2, else T3), ranked best first.

Every generated token carries the style's log-probability (the policy re-expresses its style at
every token): under the trainer's token-level aggregation a long pass is reinforced more than a
short one, which is the length bias GRPO is known for. That is an assumption of this model, stated
in the protocol; the mechanism result is conditional on it.

Outcomes are exact under the final policy (expectations over task type, style and test outcome,
not samples): primary — pass rate (correct, hidden-test) and bloated share of correct passes;
secondary — hacked share of test passes, mean length, redundant share. Seeds are paired across
arms (same seed: same task draws and initial state) and are the unit of every test.

    .venv/bin/python bench/mechanism.py [--seeds 20] [--steps 40] [--workers 2] [--quick]

Writes ``docs/results/mechanism-<date>.json`` and ``docs/results/mechanism-<date>/*.png`` (or the
paths given) and prints a table per cell.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import itertools
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.record import save  # noqa: E402
from gagar.driver.advantages import Rollout, group_advantages, token_advantages  # noqa: E402
from gagar.rollout.agent import Trajectory, Turn  # noqa: E402
from gagar.spec import (  # noqa: E402
    AlgorithmSpec,
    LengthPenalty,
    QualityFactors,
    Redistribution,
    SegmentPenalty,
)
from gagar.trainer import gar  # noqa: E402
from gagar.trainer.loss import (  # noqa: E402
    AggMode,
    LossConfig,
    PolicyBatch,
    global_counts,
    policy_loss,
    prompt_token_counts,
)
from gagar.wire import Finding, Hack, Ranking, TiedGroup  # noqa: E402

STYLES = ("clean", "bloated", "redundant", "wrong")
CLEAN, BLOATED, REDUNDANT, WRONG = range(4)
ARMS = (
    "grpo", "gagar", "gagar-redistribution", "gagar-shaping", "grpo-length-penalty",
    # issue 50: the assumptions varied: hack zeroing alone, and the control's weight swept
    "gagar-hack-zeroing", "grpo-length-penalty-x2", "grpo-length-penalty-x4",
)  # fmt: skip
HORIZON = (10, 20, 30)  # steps at which the effects are also reported (and the final one)
PRIMARY = ("pass_rate", "bloated_share")
SECONDARY = ("hack_share", "mean_length", "redundant_share")
# Comparisons named before running: each GAGAR arm and the length-penalty control against GRPO,
# and full GAGAR against the control (is GAGAR more than a length penalty?).
COMPARISONS = (
    ("gagar", "grpo"),
    ("gagar-redistribution", "grpo"),
    ("gagar-shaping", "grpo"),
    ("grpo-length-penalty", "grpo"),
    ("gagar", "grpo-length-penalty"),
    # issue 50: the assumptions varied
    ("gagar-hack-zeroing", "grpo"),
    ("grpo-length-penalty-x2", "grpo"),
    ("grpo-length-penalty-x4", "grpo"),
    ("gagar", "grpo-length-penalty-x4"),
)
SECONDARY_COMPARISONS = (
    ("gagar", "grpo"),
    # does a control shorten trajectories as much as GAGAR does? (mean_length among them)
    ("gagar", "grpo-length-penalty"),
    ("gagar", "grpo-length-penalty-x2"),
    ("gagar", "grpo-length-penalty-x4"),
)


@dataclass(frozen=True)
class Task:
    """The simulated task: per style (in ``STYLES`` order) and task type (easy, hard)."""

    pass_prob: tuple[tuple[float, ...], tuple[float, ...]] = (
        (0.70, 0.70, 0.65, 0.0),
        (0.30, 0.30, 0.25, 0.0),
    )
    length: tuple[float, ...] = (30, 70, 60, 25)  # simulated tokens (1 = 10 real tokens)
    length_sd: float = 0.2  # log-normal spread of lengths
    tool_calls: tuple[int, ...] = (4, 5, 8, 3)
    redundant_calls: tuple[int, ...] = (0, 0, 4, 0)
    hack_prob: float = 0.3  # a wrong solution games the tests
    detect_prob: float = 0.7  # the grader confirms a gamed pass as a hack
    quality: tuple[float, ...] = (1.0, 0.0, 0.4, -0.5)  # grader's true score; [3]: undetected hack
    hard_share: float = 0.5

    def with_bonus(self, bonus: float) -> Task:
        easy, hard = (
            tuple(p + bonus * (s == BLOATED) for s, p in enumerate(r)) for r in self.pass_prob
        )
        return Task(**(asdict(self) | {"pass_prob": (easy, hard)}))


@dataclass(frozen=True)
class Config:
    """One run's settings (the protocol's fixed part)."""

    steps: int = 40
    tasks_per_step: int = 8
    group_size: int = 8
    lr: float = 0.1
    grad_clip: float = 1.0
    task: Task = field(default_factory=Task)
    aggregation: AggMode = "prompt-mean"
    """The loss's aggregation: ``prompt-mean`` (the trainer's default) weights a sequence by its
    tokens within its prompt, so a long pass is reinforced more than a short one (the length bias
    the result rests on); ``seq-mean-token-mean`` counts every sequence once (issue 50)."""


# ---------------------------------------------------------------- the grader


def grader_sigma(q: float, gap: float = 1.0) -> float:
    """Noise σ with P(clean score > bloated score) = q for scores quality + σ·N(0,1), quality
    gap ``gap``: Φ(gap / (σ√2)) = q. q = 1 is a perfect grader (σ = 0)."""
    from scipy.stats import norm

    if not 0.5 < q <= 1:
        raise ValueError(f"grader accuracy q must be in (0.5, 1]: {q}")
    return 0.0 if q == 1 else gap / (math.sqrt(2) * float(norm.ppf(q)))


def _tier(score: float) -> str:
    return "T1" if score >= 0.5 else "T2" if score >= -0.25 else "T3"


def grade(
    styles: list[int],
    passed: list[bool],
    hacked: list[bool],
    sigma: float,
    task: Task,
    rng: np.random.Generator,
) -> Ranking:
    """The simulated grader's ranking of one group's passes (every pass exactly once)."""
    hacks, scored = [], []
    for i, (s, ok, h) in enumerate(zip(styles, passed, hacked, strict=True)):
        if not ok:
            continue
        if h and rng.random() < task.detect_prob:
            evidence = [Finding(member=i, kind="test_tampering", reason="simulated")]
            hacks.append(Hack(member=i, evidence=evidence))
            continue
        scored.append((task.quality[s] + sigma * rng.standard_normal(), i))
    scored.sort(reverse=True)
    t1 = [i for score, i in scored if _tier(score) == "T1"]
    rest = [
        TiedGroup(tier=_tier(score), members=[i]) for score, i in scored if _tier(score) != "T1"
    ]
    groups = ([TiedGroup(tier="T1", members=t1)] if t1 else []) + rest
    return Ranking(tied_groups=groups, hacks=hacks, grader="heuristic")


# ---------------------------------------------------------------- one group of rollouts


@dataclass
class Group:
    styles: list[int]
    rollouts: list[Rollout]
    hacked: list[bool]
    hard: bool


@functools.lru_cache(maxsize=4096)
def _trajectory(length: int, calls: int, redundant: int) -> Trajectory:
    """A trajectory of ``length`` generated tokens in ``calls`` turns, the last ``redundant`` of
    them flagged as redundant tool calls (what segment shaping acts on). Cached: the advantage
    code only reads trajectories."""
    bounds = np.linspace(0, length, calls + 1).round().astype(int)
    turns = [
        Turn(
            start=int(a),
            end=int(b),
            text="",
            call=None,
            flags={"redundant"} if k >= calls - redundant else set(),
        )
        for k, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    return Trajectory(
        token_ids=[0] * length, logprobs=[0.0] * length, loss_mask=[1] * length,
        prompt_len=0, messages=[], turns=turns,
    )  # fmt: skip


def sample_group(
    probs: np.ndarray, hard: bool, n: int, task: Task, rng: np.random.Generator
) -> Group:
    """n rollouts of one task: styles from the policy, then lengths and test outcomes."""
    styles = rng.choice(len(STYLES), size=n, p=probs).tolist()
    rollouts, hacked = [], []
    for s in styles:
        length = max(4, round(task.length[s] * math.exp(task.length_sd * rng.standard_normal())))
        correct = rng.random() < task.pass_prob[int(hard)][s]
        gamed = s == WRONG and rng.random() < task.hack_prob
        traj = _trajectory(length, task.tool_calls[s], task.redundant_calls[s])
        rollouts.append(
            Rollout(trajectory=traj, passed=correct or gamed, valid=True, tampered=gamed)
        )
        hacked.append(gamed)
    return Group(styles, rollouts, hacked, hard)


# ---------------------------------------------------------------- advantages per arm

ArmFn = Callable[[list[Group], list[Ranking | None]], list[list[float]]]
_GAGAR = AlgorithmSpec()
_GRPO = AlgorithmSpec(mode="grpo")
_REDIST = AlgorithmSpec(
    length_penalty=LengthPenalty(enabled=False), segment_penalty=SegmentPenalty(enabled=False)
)
# hack zeroing alone: the grader's hack verdicts, every quality factor 1 (no redistribution), no
# length penalty or segment shaping
_HACKS = _REDIST.model_copy(
    update={
        "redistribution": Redistribution(
            quality_factors=QualityFactors(**dict.fromkeys(QualityFactors.model_fields, 1.0))
        )
    }
)


def _driver(alg: AlgorithmSpec, use_rankings: bool) -> ArmFn:
    def fn(groups: list[Group], rankings: list[Ranking | None]) -> list[list[float]]:
        rollouts = [g.rollouts for g in groups]
        given = rankings if use_rankings else [None] * len(groups)
        batch = group_advantages(rollouts, given, alg)
        return token_advantages(rollouts, batch.adv, alg)

    return fn


def _grpo_length_penalty(scale: float = 1.0) -> ArmFn:
    """GRPO on the test reward minus the project's length penalty with GAGAR's own parameters, its
    weight times ``scale``, without any grader: the control for "it is only a length penalty"
    (``scale`` 1: matched in parameters; 2 and 4: the sweep that asks how strong a penalty must be
    to shorten trajectories as much as GAGAR does)."""
    penalty = _GAGAR.length_penalty.model_copy(
        update={"weight": _GAGAR.length_penalty.weight * scale}
    )

    def fn(groups: list[Group], rankings: list[Ranking | None]) -> list[list[float]]:
        rollouts = [g.rollouts for g in groups]
        passed = torch.tensor([[r.passed for r in g] for g in rollouts])
        valid = torch.ones_like(passed)
        lengths = torch.tensor(
            [[[r.trajectory.num_turns, r.trajectory.response_tokens] for r in g] for g in rollouts],
            dtype=torch.float64,
        )  # (G, n, 2)
        rewards = gar.length_penalty(passed.double(), passed, valid, lengths, penalty)
        adv = gar.grpo_advantages(rewards, valid)
        return token_advantages(rollouts, adv, _GRPO)

    return fn


ARM_FNS: dict[str, ArmFn] = {
    "grpo": _driver(_GRPO, use_rankings=False),
    "gagar": _driver(_GAGAR, use_rankings=True),
    "gagar-redistribution": _driver(_REDIST, use_rankings=True),
    # shaping alone: GAGAR's length penalty and segment shaping, no ranking (no redistribution,
    # no hack zeroing)
    "gagar-shaping": _driver(_GAGAR, use_rankings=False),
    "grpo-length-penalty": _grpo_length_penalty(),
    "gagar-hack-zeroing": _driver(_HACKS, use_rankings=True),
    "grpo-length-penalty-x2": _grpo_length_penalty(2.0),
    "grpo-length-penalty-x4": _grpo_length_penalty(4.0),
}


# ---------------------------------------------------------------- exact outcomes of a policy


def outcomes(probs: np.ndarray, task: Task) -> dict[str, float]:
    """Exact expectations under the policy ``probs`` (2, styles) over task type and test outcome."""
    w = np.array([1 - task.hard_share, task.hard_share])[:, None]  # (2, 1)
    p_correct = np.array(task.pass_prob)  # (2, S)
    correct = w * probs * p_correct  # (2, S)
    gamed = (w * probs)[:, WRONG].sum() * task.hack_prob
    lengths = np.array(task.length) * math.exp(task.length_sd**2 / 2)  # log-normal mean
    return {
        "pass_rate": float(correct.sum()),
        "bloated_share": float(correct[:, BLOATED].sum() / correct.sum()),
        "redundant_share": float(correct[:, REDUNDANT].sum() / correct.sum()),
        "hack_share": float(gamed / (gamed + correct.sum())),
        "mean_length": float(10 * ((w * probs) * lengths).sum()),  # real tokens
    }


# ---------------------------------------------------------------- one run


def _step_batch(
    groups: list[Group], token_adv: list[list[float]], logits: torch.Tensor
) -> PolicyBatch:
    """Every generated token carries log π(style | task type) (module docstring)."""
    flat = [(g, s, r) for g in groups for s, r in zip(g.styles, g.rollouts, strict=True)]
    width = max(len(a) for a in token_adv)
    mask = torch.zeros(len(flat), width, dtype=torch.bool)
    adv = torch.zeros(len(flat), width, dtype=torch.float64)
    for i, a in enumerate(token_adv):
        mask[i, : len(a)] = True
        adv[i, : len(a)] = torch.tensor(a, dtype=torch.float64)
    logp_all = torch.log_softmax(logits, -1)  # (2, S)
    rows = torch.tensor([int(g.hard) for g, _, _ in flat])
    cols = torch.tensor([s for _, s, _ in flat])
    logp = logp_all[rows, cols][:, None].expand(-1, width)  # (N, T)
    gid = torch.arange(len(groups)).repeat_interleave(len(groups[0].styles))
    return PolicyBatch(
        logp=logp, old_logp=logp.detach(), adv=adv, mask=mask,
        prompt_tokens=prompt_token_counts(mask, gid),
    ), global_counts(mask, gid)  # type: ignore[return-value]  # fmt: skip


def run(arm: str, q: float, bonus: float, seed: int, cfg: Config) -> dict[str, Any]:
    """One training run; returns the final exact outcomes and their per-step curve."""
    torch.set_num_threads(1)
    task = cfg.task.with_bonus(bonus)
    sigma = grader_sigma(q)
    rng = np.random.default_rng([seed, int(q * 1000), int(bonus * 1000)])
    task_rng = np.random.default_rng([seed, 7])  # same task draws for every arm and cell
    logits = torch.zeros(2, len(STYLES), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=cfg.lr)
    loss_cfg = LossConfig(agg_mode=cfg.aggregation)  # PPO clip as the trainer's defaults
    curve, pairs, trained = [], [0, 0, 0], 0
    for _ in range(cfg.steps):
        probs = torch.softmax(logits.detach(), -1).numpy()
        curve.append(outcomes(probs, task))
        hard = task_rng.random(cfg.tasks_per_step) < task.hard_share
        groups = [sample_group(probs[int(h)], bool(h), cfg.group_size, task, rng) for h in hard]
        # dynamic sampling: only eligible groups (≥ 1 test pass and ≥ 1 failure) train
        groups = [g for g in groups if 0 < sum(r.passed for r in g.rollouts) < cfg.group_size]
        if not groups:
            continue
        rankings: list[Ranking | None] = [
            grade(g.styles, [r.passed for r in g.rollouts], g.hacked, sigma, task, rng)
            for g in groups
        ]
        _count_pairs(groups, rankings, pairs)
        token_adv = ARM_FNS[arm](groups, rankings)
        batch, counts = _step_batch(groups, token_adv, logits)
        loss, _ = policy_loss(batch, counts, loss_cfg)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([logits], cfg.grad_clip)
        opt.step()
        trained += len(groups)
    final = outcomes(torch.softmax(logits.detach(), -1).numpy(), task)
    return {"final": final, "curve": curve, "grader_pairs": pairs, "groups_trained": trained}


def _count_pairs(groups: list[Group], rankings: list[Ranking | None], pairs: list[int]) -> None:
    """Tally (clean, bloated) pass pairs in one group, ``[pairs, right, tied]``: right when the
    clean pass's quality factor (``gar.quality_factors``: what moves the advantages) is above the
    bloated one's, tied when they are equal (one tied group, or two T1 groups past the first);
    the grader's realised accuracy on what it changes, recorded as a check on ``q``. (Before
    issue 50 a pair tied in one T1 group counted as right.)"""
    for g, r in zip(groups, rankings, strict=True):
        assert r is not None
        factor = gar.quality_factors(r.tied_groups, len(g.styles))
        listed = {m for t in r.tied_groups for m in t.members}
        clean = [i for i in listed if g.styles[i] == CLEAN]
        bloated = [i for i in listed if g.styles[i] == BLOATED]
        for c in clean:
            for b in bloated:
                pairs[0] += 1
                pairs[1] += int(factor[c] > factor[b])
                pairs[2] += int(factor[c] == factor[b])


# ---------------------------------------------------------------- the grid and its tests


def _job(
    args: tuple[str, float, float, int, Config],
) -> tuple[str, float, float, int, dict[str, Any]]:
    arm, q, bonus, seed, cfg = args
    return arm, q, bonus, seed, run(arm, q, bonus, seed, cfg)


def run_grid(
    qs: list[float], bonuses: list[float], seeds: list[int], cfg: Config, workers: int
) -> dict[tuple[float, float], dict[str, list[dict[str, Any]]]]:
    """Every (cell, arm, seed) run; results ordered by seed within each arm (pairing)."""
    jobs = [(a, q, b, s, cfg) for q in qs for b in bonuses for a in ARMS for s in seeds]
    if workers > 1:
        with mp.get_context("fork").Pool(workers) as pool:
            done = pool.map(_job, jobs, chunksize=4)
    else:
        done = [_job(j) for j in jobs]
    grid: dict[tuple[float, float], dict[str, list[dict[str, Any]]]] = {}
    for arm, q, b, _seed, res in done:
        grid.setdefault((q, b), {}).setdefault(arm, []).append(res)
    return grid


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = PRIMARY + SECONDARY
    return {k: stats.mean_ci95([r["final"][k] for r in runs]) for k in keys}


def tests_for(
    grid: dict[tuple[float, float], dict[str, list[dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """Paired t-tests over seeds (the unit) for every named comparison, Holm over all of them."""
    out = []
    for (q, b), arms in grid.items():
        planned = [(c, k, "primary") for c in COMPARISONS for k in PRIMARY]
        planned += [(c, k, "secondary") for c in SECONDARY_COMPARISONS for k in SECONDARY]
        for (arm, base), key, kind in planned:
            a = [r["final"][key] for r in arms[arm]]
            ref = [r["final"][key] for r in arms[base]]
            res = stats.paired_t(a, ref)
            out.append(
                {"q": q, "bonus": b, "arm": arm, "baseline": base, "outcome": key, "kind": kind}
                | res
            )
    for t, p in zip(out, stats.holm([t["p_value"] for t in out]), strict=True):
        t["p_holm"] = p
    return out


def horizon_for(
    grid: dict[tuple[float, float], dict[str, list[dict[str, Any]]]], steps: int
) -> list[dict[str, Any]]:
    """The primary comparisons at steps ``HORIZON`` and at the end, paired over seeds:
    descriptive (no Holm; the named tests are the final ones), so that a reader sees whether an
    effect is still growing, or changes sign, along the run."""
    out = []
    for (q, b), arms in grid.items():
        for (arm, base), key in ((c, k) for c in COMPARISONS for k in PRIMARY):
            for step in (*(h for h in HORIZON if h < steps), steps):
                at = [
                    [r["curve"][step][key] if step < steps else r["final"][key] for r in arms[x]]
                    for x in (arm, base)
                ]
                res = stats.paired_t(*at)
                out.append(
                    {"q": q, "bonus": b, "arm": arm, "baseline": base, "outcome": key}
                    | {"step": step, "mean_difference": res["mean_difference"]}
                    | {"low": res["low"], "high": res["high"], "p_value": res["p_value"]}
                )
    return out


def records(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per seed: the final outcomes and the per-step curve (5 significant digits), the groups
    trained and the grader's pairs: what a reader needs to recompute every test."""

    def r5(d: dict[str, float]) -> dict[str, float]:
        return {k: float(f"{v:.5g}") for k, v in d.items()}

    return [
        {
            "seed": seed,
            "final": r5(r["final"]),
            "curve": [r5(c) for c in r["curve"]],
            "groups_trained": r["groups_trained"],
            "grader_pairs": r["grader_pairs"],
        }
        for seed, r in enumerate(runs)
    ]


def protocol(
    qs: list[float], bonuses: list[float], seeds: list[int], cfg: Config
) -> dict[str, Any]:
    return {
        "question": "does the grader-guided advantage lower the bloated share of correct passes "
        "without lowering the pass rate, and does that survive a noisy grader?",
        "seeds": seeds,
        "grid": {"q": qs, "bloated_pass_bonus": bonuses},
        "arms": list(ARMS),
        "primary_outcomes": list(PRIMARY),
        "secondary_outcomes": list(SECONDARY),
        "comparisons": [list(c) for c in COMPARISONS],
        "secondary_comparisons": [list(c) for c in SECONDARY_COMPARISONS],
        "test": "paired t-test over seeds (scipy.stats.ttest_rel) of the final exact outcome; "
        "95 % interval of the mean paired difference; Holm over every test in this file",
        "unit": "seed (same task draws across arms and cells)",
        "outcome_definition": "exact expectation under the final policy, not a sample",
        "assumption": "every generated token carries the style's log-probability; under "
        "prompt-mean (the default) a long pass is then reinforced more than a short one; "
        f"this run's aggregation: {cfg.aggregation}",
        "horizon": f"the primary comparisons also at steps {list(HORIZON)} (descriptive, "
        "no Holm: `horizon`)",
        "records": "per cell and arm, per seed: final outcomes and per-step curve (`runs`)",
        "grader_accuracy": "a (clean, bloated) pair is right when the clean pass's quality factor "
        "is above the bloated one's (ties counted apart)",
        "config": asdict(cfg),
        "algorithm_defaults": _GAGAR.model_dump(by_alias=True, mode="json"),
    }


def write_plots(
    grid: dict[tuple[float, float], dict[str, list[dict[str, Any]]]], out_dir: Path
) -> list[str]:
    """Per-step mean (over seeds) of the primary outcomes, one panel per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    cells = sorted(grid, key=lambda c: (-c[0], c[1]))  # columns: q falling; rows: bonus
    for key in PRIMARY:
        fig, axes = plt.subplots(2, 3, figsize=(13, 7), sharey=True, squeeze=False)
        for ax, (q, b) in zip(axes.T.flat, cells, strict=False):
            for arm in ARMS:
                curves = np.array([[c[key] for c in r["curve"]] for r in grid[(q, b)][arm]])
                mean = curves.mean(0)
                half = (
                    1.96 * curves.std(0, ddof=1) / math.sqrt(len(curves)) if len(curves) > 1 else 0
                )
                ax.plot(mean, label=arm)
                ax.fill_between(range(len(mean)), mean - half, mean + half, alpha=0.15)
            ax.set_title(f"q = {q}, bloated-pass bonus = {b}")
            ax.set_xlabel("step")
        axes[0][0].set_ylabel(key)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{key} (mean over seeds, 95 % interval of the mean)")
        fig.tight_layout()
        path = out_dir / f"{key}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    return paths


def print_tables(cells: list[dict[str, Any]], tests: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for cell in cells:
        table = Table(
            title=f"q = {cell['q']}, bloated-pass bonus = {cell['bonus']} (final, mean [95 % CI])"
        )
        table.add_column("arm")
        for k in PRIMARY + SECONDARY:
            table.add_column(k)
        for arm, s in cell["arms"].items():
            table.add_row(
                arm,
                *(
                    f"{s[k]['mean']:.3f} [{s[k]['low']:.3f}, {s[k]['high']:.3f}]"
                    for k in PRIMARY + SECONDARY
                ),
            )
        console.print(table)
    table = Table(title="primary tests: arm − baseline, paired over seeds (Holm over all tests)")
    for col in ("q", "bonus", "arm − baseline", "outcome", "diff [95 % CI]", "p", "p_holm"):
        table.add_column(col)
    for t in tests:
        if t["kind"] == "primary":
            table.add_row(
                str(t["q"]), str(t["bonus"]), f"{t['arm']} − {t['baseline']}", t["outcome"],
                f"{t['mean_difference']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]",
                f"{t['p_value']:.2g}", f"{t['p_holm']:.2g}",
            )  # fmt: skip
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=Config.steps)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--q", type=float, nargs="+", default=[1.0, 0.8, 0.6])
    ap.add_argument("--bonus", type=float, nargs="+", default=[0.0, 0.1])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default docs/results/mechanism-<date>.json)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny grid for a smoke run")
    ap.add_argument(
        "--aggregation",
        default="prompt-mean",
        choices=["prompt-mean", "seq-mean-token-mean", "token-mean"],
        help="the loss's aggregation (seq-mean-token-mean: no token weighting)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.q, args.bonus = 3, 5, [1.0], [0.1]
    cfg = Config(steps=args.steps, aggregation=args.aggregation)
    seeds = list(range(args.seeds))
    out = args.out or ROOT / "docs" / "results" / f"mechanism-{dt.date.today().isoformat()}.json"
    start = time.monotonic()
    grid = run_grid(args.q, args.bonus, seeds, cfg, args.workers)
    elapsed = time.monotonic() - start
    cells = [
        {
            "q": q, "bonus": b,
            "arms": {arm: _summary(runs) for arm, runs in arms.items()},
            "grader_accuracy": _accuracy(arms),
            "groups_trained_per_run": stats.mean_ci95([r["groups_trained"] for runs in arms.values() for r in runs])["mean"],
            "runs": {arm: records(runs) for arm, runs in arms.items()},
        }
        for (q, b), arms in grid.items()
    ]  # fmt: skip
    tests = tests_for(grid)
    plots = write_plots(grid, out.with_suffix(""))
    result = {
        "bench": "mechanism",
        "protocol": protocol(args.q, args.bonus, seeds, cfg),
        "cells": cells,
        "tests": tests,
        "horizon": horizon_for(grid, cfg.steps),
        "plots": plots,
        "elapsed_seconds": round(elapsed, 1),
        "load_average": os.getloadavg(),
    }
    save(out, result, indent=1)
    print_tables(cells, tests)
    print(f"{len(ARMS) * len(seeds) * len(cells)} runs in {elapsed:.0f} s -> {out}")
    return 0


def _accuracy(arms: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    total = sum(r["grader_pairs"][0] for runs in arms.values() for r in runs)
    right = sum(r["grader_pairs"][1] for runs in arms.values() for r in runs)
    tied = sum(r["grader_pairs"][2] for runs in arms.values() for r in runs)
    low, high = stats.proportion_ci(right, total)
    return {
        "clean_factor_above_bloated": right,
        "tied_factor": tied,
        "pairs": total,
        "rate": right / total if total else None,  # strictly above: a tie moves nothing
        "low": low,
        "high": high,
    }


if __name__ == "__main__":
    raise SystemExit(main())
