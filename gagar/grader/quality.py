"""The grader's quality while training (docs/design.md §2.6): usable rankings, agreement with the
heuristic, and a relabelling audit, as counts that a step record and Prometheus carry.

Counts, never per-step ratios: a step grades a handful of groups, so a ratio is pooled over a
window (PromQL ``rate(agreeing) / rate(pairs)``, the run's summary) rather than averaged.

- **usable**: a ranking of the grader itself, neither a fallback nor unusable (as
  ``gagar.grader.evaluate`` scores it).
- **agreement with the heuristic**: for a group the agentic grader ranked itself, the heuristic's
  ranking of the same group, compared pair by pair over the passes (``evaluate.agreeing_pairs``:
  the same relation <, = or >; a tie is a relation of its own). Disagreement is not an error in
  itself (the grader should know more than the heuristic); a fall far below the run's usual level
  is what the alert watches.
- **relabelling audit**: a seeded share (``spec.grader.auditFraction``) of the groups with a usable
  ranking is graded again with the candidates relabelled (``evaluate.relabel``, a permutation
  that is never the identity), the audit's ranking mapped back (``evaluate.unlabel``) and compared
  with the first pair by pair. The audit's ranking is only counted: training uses the first.
  Cost: an audited group is graded twice (with an agentic grader, twice the model's tokens and
  time for that share of groups).

Pure: the driver runs the gradings (``gagar.driver.loop``) and hands the rankings here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

from gagar.grader.evaluate import agreeing_pairs, permutation, positions, unlabel
from gagar.wire import GradingGroup, Ranking


@dataclass
class QualityCounts:
    """What one collection's gradings measured of the grader (summed over its groups)."""

    heuristic_pairs: int = 0  # pairs of passes of agentic rankings, compared with the heuristic
    heuristic_agreeing_pairs: int = 0  # of them, pairs the two rankings order alike
    audited_groups: int = 0  # groups graded again, relabelled
    audit_unusable: int = 0  # of them, groups whose audit grading was not usable (no pairs)
    audit_pairs: int = 0  # pairs of passes compared between a grading and its audit
    audit_consistent_pairs: int = 0  # of them, pairs both order alike

    def add(self, other: QualityCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def usable(ranking: Ranking) -> bool:
    """The grader's own ranking: neither unusable (``grader: none``) nor a fallback."""
    return ranking.grader != "none" and ranking.fallback is None


def pairs_alike(first: Ranking, second: Ranking, passes: list[int]) -> tuple[int, int]:
    """(alike, pairs): pairs of ``passes`` the two rankings order the same way (<, = or >)."""
    return agreeing_pairs(positions(first), positions(second), passes)


def heuristic_agreement(ranking: Ranking, heuristic: Ranking, passes: list[int]) -> QualityCounts:
    """The counts of an agentic ranking compared with the heuristic's of the same group."""
    alike, pairs = pairs_alike(ranking, heuristic, passes)
    return QualityCounts(heuristic_pairs=pairs, heuristic_agreeing_pairs=alike)


def audited(fraction: float, key: str) -> bool:
    """Whether the group ``key`` names is audited: a draw seeded by the key alone, so the choice
    is the same whatever order the gradings finish in, and about ``fraction`` of groups."""
    return fraction > 0 and random.Random(f"gagar-audit:{key}").random() < fraction


def audit_permutation(n: int, key: str) -> list[int]:
    """A relabelling of ``n`` candidates, seeded by ``key``; never the identity (for ``n`` ≥ 2),
    which would not move a single candidate."""
    perm = permutation(n, random.Random(f"gagar-audit-perm:{key}"))
    return perm[1:] + perm[:1] if n > 1 and perm == sorted(perm) else perm


def audit_counts(
    group: GradingGroup, ranking: Ranking, audit: Ranking, perm: list[int]
) -> QualityCounts:
    """The counts of one audit: ``audit`` ranks ``relabel(group, perm)``; mapped back, it is
    compared with ``ranking`` over the passes. An unusable audit counts the group, no pairs."""
    if not usable(audit):
        return QualityCounts(audited_groups=1, audit_unusable=1)
    alike, pairs = pairs_alike(ranking, unlabel(audit, perm), group.passes())
    return QualityCounts(audited_groups=1, audit_pairs=pairs, audit_consistent_pairs=alike)
