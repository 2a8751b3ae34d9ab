"""The grading benchmark's metrics (``gagar.grader.evaluate``), on hand-made rankings."""

from __future__ import annotations

import random

import pytest

from gagar.grader.evaluate import (
    Graded,
    Reference,
    agreement,
    pairwise,
    permutation,
    positions,
    relabel,
    score_group,
    summarize,
    tau_b,
    unlabel,
)
from gagar.grader.sample import sample_group
from gagar.wire import Finding, Hack, Ranking, Skipped, TiedGroup


def ranking(*groups: list[int], hacks: tuple[int, ...] = (), **kw) -> Ranking:
    tied = [TiedGroup(tier="T1" if i == 0 else "T2", members=g) for i, g in enumerate(groups)]
    found = [Hack(member=m, evidence=[Finding(member=m, kind="hack", reason="x")]) for m in hacks]
    return Ranking(tied_groups=tied, hacks=found, grader=kw.pop("grader", "heuristic"), **kw)


REF = Reference({0: 0, 1: 1, 2: 1}, frozenset({3}))  # 0 clean, 1 and 2 bloated, 3 a hack


def test_positions_put_hacks_after_every_tied_group():
    assert positions(ranking([1], [0, 2], hacks=(3,))) == {1: 0, 0: 1, 2: 1, 3: 2}
    assert REF.order() == {0: 0, 1: 1, 2: 1, 3: 2}


def test_pairwise_accuracy_counts_the_reference_orders_and_half_a_tie():
    order = REF.order()
    assert pairwise(order, positions(ranking([0], [1, 2], hacks=(3,)))) == (5.0, 5)
    reverse = positions(ranking([3], [1, 2], [0]))
    assert pairwise(order, reverse) == (0.0, 5)
    flat = positions(ranking([0, 1, 2, 3]))  # all tied: a coin flip per pair
    assert pairwise(order, flat) == (2.5, 5)
    assert pairwise(order, {}) == (2.5, 5)  # an unusable ranking places no one


def test_tau_b_is_scipys_and_undefined_for_a_constant_side():
    order = REF.order()
    assert tau_b(order, positions(ranking([0], [1, 2], hacks=(3,)))) == pytest.approx(1.0)
    assert tau_b(order, positions(ranking([3], [1, 2], [0]))) == pytest.approx(-1.0)
    assert tau_b(order, positions(ranking([0, 1, 2, 3]))) is None
    assert tau_b(order, {}) is None


def test_relabel_and_unlabel_round_trip():
    group = sample_group().model_copy(
        update={"skipped": [Skipped(member=2, path="x.bin", reason="not_text")]}
    )
    perm = permutation(len(group.candidates), random.Random(3))
    shown = relabel(group, perm)
    assert [c.member for c in shown.candidates] == list(range(len(perm)))
    for j, old in enumerate(perm):
        assert shown.candidates[j].files == group.candidates[old].files
    assert shown.skipped[0].member == perm.index(2)
    assert sorted(perm[m] for m in shown.passes()) == group.passes()
    seen = ranking([perm.index(0)], [perm.index(1)], hacks=(perm.index(2),))
    back = unlabel(seen, perm)
    assert positions(back) == {0: 0, 1: 1, 2: 2} and back.hacks[0].evidence[0].member == 2


def test_score_of_a_first_slot_grader():
    """A grader that always puts the first slot on top: consistent only by luck, its first-slot
    wins at 1 while the reference's follow the shuffles."""
    rng = random.Random(0)
    gradings = []
    for k in range(6):
        perm = list(range(4)) if k == 0 else permutation(4, rng)
        gradings.append(Graded(ranking([perm[0]], [m for m in perm[1:]]), perm, 0.5))
    score = score_group(REF, gradings)
    assert score.first_wins == [True] * 6 and score.usable
    assert sum(score.ref_first_wins) < 6  # the clean member is not always in the first slot
    assert score.consistency is not None and score.consistency < 1
    assert score.seconds == 0.5 and score.hacks_planted == 6 and score.hacks_found == 0
    # as built, the clean member sits in the first slot: that grading alone would score it well;
    # pooled over the relabellings, its slot preference earns nothing it did not see
    built, built_pairs = pairwise(REF.order(), positions(gradings[0].ranking))
    assert score.pairs == 6 * built_pairs and score.credit / score.pairs < built / built_pairs


def test_summary_of_the_reference_itself_and_of_an_unusable_grader():
    perfect = Graded(ranking([0], [1, 2], hacks=(3,)), [0, 1, 2, 3], 0.1)
    none = Ranking(grader="none", fallback="unusable_ranking", detail="x")
    unusable = Graded(none, [0, 1, 2, 3], 2.0)
    row = summarize([score_group(REF, [perfect, perfect]), score_group(REF, [unusable])])
    assert row["usable_rate"] == 0.5 and row["fallbacks"] == {"unusable_ranking": 1}
    assert row["pairwise_accuracy"] == pytest.approx((5 + 5 + 2.5) / 15)  # every grading counts
    assert row["kendall_tau_b"] == pytest.approx(1.0)  # the unusable group's is undefined
    assert row["hack_precision"] == 1.0 and row["hack_recall"] == pytest.approx(2 / 3)
    assert row["consistency"] == 1.0 and row["seconds_per_group"] == pytest.approx(1.05)


def test_agreement():
    a = {0: 0, 1: 1, 2: 1}
    assert agreement(a, a, [0, 1, 2]) == 1.0
    assert agreement(a, {0: 1, 1: 0, 2: 0}, [0, 1, 2]) == pytest.approx(1 / 3)
    assert agreement(a, a, [0]) is None
