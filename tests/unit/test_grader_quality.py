"""The grader's quality while training: agreement with the heuristic on a scripted agentic grader,
the relabelling audit at ``spec.grader.auditFraction``, and the counts in the step's record and on
the trainer's /metrics. The alerts over these counters: tests/integration/test_grader_quality_alerts.py."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from gagar.driver import loop
from gagar.driver import report as rep
from gagar.driver.record import StepSamples
from gagar.grader import quality
from gagar.grader.agentic import AgenticConfig, AgenticGrader
from gagar.grader.evaluate import positions, relabel
from gagar.grader.local_sandbox import unsafe_local_factory
from gagar.grader.protocol import HeuristicGrader
from gagar.grader.sample import sample_group
from gagar.metrics import Metrics
from gagar.spec import GraderSpec
from gagar.wire import GradingGroup, Ranking, TiedGroup
from tests.support.fake_openai import FakeOpenAI, text, tool_call
from tests.support.records import step_record

GROUP = sample_group()
HEURISTIC = positions(HeuristicGrader().grade_sync(GROUP))  # {0: 0, 1: 1, 2: 2}: T1, T3, a hack


def _scripted(order: dict[int, int]):
    """An agentic grader's model: lists the files once, then places each pass at ``order``."""

    def answer(body: dict) -> dict:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return tool_call("list_files", {})
        placed = {
            f"cand_{m}": {"place": p + 1, "tier": "T1", "reason": "read the diff"}
            for m, p in order.items()
        }
        return tool_call("submit_ranking", placed)

    return answer


def _ctx(grader, tmp_path, audit_fraction=0.0, fallback="heuristic"):
    spec = GraderSpec.model_construct(
        deadline_seconds=30.0, fallback=fallback, audit_fraction=audit_fraction
    )
    services = SimpleNamespace(grader=grader, fallback_grader=HeuristicGrader())
    run = SimpleNamespace(spec=SimpleNamespace(grader=spec, algorithm=SimpleNamespace(seed=3)))
    alg = run.spec.algorithm
    return SimpleNamespace(run=run, services=services, out=tmp_path, step=4, version=5, alg=alg)


def _grade(ctx, groups, monkeypatch):
    """Each group of ``groups`` through the loop's grading; (rankings, counts)."""
    monkeypatch.setattr(loop, "grading_group", lambda g: g)
    # the groups here are already the wire form: no task, so no held-back outcomes to record
    monkeypatch.setattr(loop, "held_back_outcomes", lambda g, passes: None)
    counts = quality.QualityCounts()

    async def grade_all():
        return await asyncio.gather(*(loop._grade(ctx, g, counts) for g in groups))

    return asyncio.run(grade_all()), counts


def test_agentic_rankings_count_their_agreement_with_the_heuristic(tmp_path, monkeypatch):
    reverse = {m: 2 - p for m, p in HEURISTIC.items()}
    for order, agreeing in ((HEURISTIC, 3), (reverse, 0)):
        with FakeOpenAI([_scripted(order)] * 2) as fake:
            grader = AgenticGrader(
                AgenticConfig(base_url=fake.base_url, model="m"), unsafe_local_factory, tmp_path
            )
            (ranking,), counts = _grade(_ctx(grader, tmp_path), [GROUP], monkeypatch)
        assert ranking.grader == "agentic" and ranking.fallback is None
        # training gets the grader's ranking, not the heuristic's
        assert positions(ranking) == order
        assert (counts.heuristic_pairs, counts.heuristic_agreeing_pairs) == (3, agreeing)


def test_fallbacks_and_heuristic_rankings_are_not_compared_with_the_heuristic(
    tmp_path, monkeypatch
):
    with FakeOpenAI([text("no idea")] * 4) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m", max_retries=1)
        grader = AgenticGrader(config, unsafe_local_factory, tmp_path)
        (ranking,), counts = _grade(_ctx(grader, tmp_path), [GROUP], monkeypatch)
    assert ranking.grader == "heuristic" and ranking.fallback == "unusable_ranking"
    assert counts == quality.QualityCounts()
    _, counts = _grade(_ctx(HeuristicGrader(), tmp_path), [GROUP], monkeypatch)
    assert counts == quality.QualityCounts()  # the heuristic against itself says nothing


class ByContent:
    """A deterministic agentic grader that ranks passes by their patch (shortest first): what a
    grader that reads the candidates does, whatever their labels."""

    def __init__(self) -> None:
        self.seen: list[GradingGroup] = []

    async def grade(self, group: GradingGroup) -> Ranking:
        self.seen.append(group)
        cands = [group.candidates[m] for m in group.passes()]
        ordered = sorted(cands, key=lambda c: (len(c.patch), c.patch))
        tied = [TiedGroup(tier="T1", members=[c.member]) for c in ordered]
        return Ranking(tied_groups=tied, grader="agentic")


class BySlot(ByContent):
    """Ranks passes by their label alone (first slot best): pure position bias."""

    async def grade(self, group: GradingGroup) -> Ranking:
        self.seen.append(group)
        tied = [TiedGroup(tier="T1", members=[m]) for m in group.passes()]
        return Ranking(tied_groups=tied, grader="agentic")


def _groups(n: int) -> list[GradingGroup]:
    return [GROUP.model_copy(update={"task_id": f"task-{i}"}) for i in range(n)]


def test_audit_fraction_sets_the_share_of_groups_graded_again(tmp_path, monkeypatch):
    groups = _groups(24)
    audited = {}
    for fraction in (0.0, 0.5, 1.0):
        grader = ByContent()
        _, counts = _grade(_ctx(grader, tmp_path, fraction), groups, monkeypatch)
        audited[fraction] = counts.audited_groups
        assert len(grader.seen) == len(groups) + counts.audited_groups  # one more grading each
    assert audited[0.0] == 0 and audited[1.0] == 24
    assert 5 <= audited[0.5] <= 19  # a seeded draw per group: about half
    chosen = [quality.audited(0.5, f"3:5:task-{i}") for i in range(24)]
    assert sum(chosen) == audited[0.5]  # the choice is the seeded one, whatever the finish order
    draws = [quality.audited(0.1, f"k{i}") for i in range(2000)]
    assert 150 <= sum(draws) <= 250  # the default share, over many groups


def test_audit_regrades_relabelled_and_counts_consistency(tmp_path, monkeypatch):
    content = ByContent()
    (ranking,), counts = _grade(_ctx(content, tmp_path, 1.0), [GROUP], monkeypatch)
    first, audit = content.seen
    assert ranking == asyncio.run(ByContent().grade(GROUP))  # training gets the first grading
    perm = quality.audit_permutation(len(GROUP.candidates), f"3:5:{GROUP.task_id}")
    assert perm != sorted(perm)
    assert audit == relabel(first, perm)  # the same candidates under other labels
    assert counts.audited_groups == 1 and counts.audit_pairs == 3
    assert counts.audit_consistent_pairs == 3  # a grader that reads the content keeps its order

    slot = BySlot()
    (biased,), counts = _grade(_ctx(slot, tmp_path, 1.0), [GROUP], monkeypatch)
    new = {old: j for j, old in enumerate(perm)}
    kept = sum(new[a] < new[b] for a, b in itertools.combinations(GROUP.passes(), 2))
    assert kept < 3  # this relabelling reorders some passes
    assert (counts.audit_pairs, counts.audit_consistent_pairs) == (3, kept)
    assert biased == asyncio.run(BySlot().grade(GROUP))  # training gets the first grading


def test_the_audit_never_changes_the_training_ranking(tmp_path, monkeypatch):
    groups = _groups(6)
    plain, _ = _grade(_ctx(BySlot(), tmp_path, 0.0), groups, monkeypatch)
    audited, counts = _grade(_ctx(BySlot(), tmp_path, 1.0), groups, monkeypatch)
    assert counts.audited_groups == 6 and counts.audit_consistent_pairs < counts.audit_pairs
    assert audited == plain


def test_an_unusable_audit_counts_the_group_and_no_pairs(tmp_path, monkeypatch):
    class FailsSecond(ByContent):
        async def grade(self, group):
            if self.seen:
                raise RuntimeError("grader pool gone")
            return await super().grade(group)

    (ranking,), counts = _grade(_ctx(FailsSecond(), tmp_path, 1.0), [GROUP], monkeypatch)
    assert ranking.grader == "agentic"
    assert (counts.audited_groups, counts.audit_unusable, counts.audit_pairs) == (1, 1, 0)


@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_an_audit_permutation_is_never_the_identity(n):
    for i in range(50):
        perm = quality.audit_permutation(n, f"k{i}")
        assert sorted(perm) == list(range(n)) and perm != list(range(n))


def test_the_counts_reach_the_trainers_metrics():
    metrics = Metrics(CollectorRegistry(), "trainer")
    counts = dict(
        usable_groups=3,
        heuristic_pairs=9,
        heuristic_agreeing_pairs=7,
        audited_groups=1,
        audit_pairs=3,
        audit_consistent_pairs=2,
    )
    record = step_record(1, **counts)
    assert record.grading.heuristic_agreeing_pairs == 7
    for _ in range(2):  # counters: a second step adds
        rep.export(metrics, "r", record, StepSamples())
    for field, value in counts.items():
        name = f"gagar_grader_{field}_total"
        got = metrics.registry.get_sample_value(name, {"run": "r"})
        assert got == 2 * value, name


def test_the_report_pools_the_counts_over_the_run():
    records = [
        step_record(1, usable_groups=2, graded_by={"agentic": 2, "heuristic": 1},
                    heuristic_pairs=6, heuristic_agreeing_pairs=3, audited_groups=1,
                    audit_pairs=3, audit_consistent_pairs=3),
        step_record(2, usable_groups=3, graded_by={"agentic": 3}, heuristic_pairs=6,
                    heuristic_agreeing_pairs=6, audited_groups=1, audit_unusable=1),
    ]  # fmt: skip
    q = rep.grader_quality(records)
    assert q["usable"] == {"count": 5, "of": 6, "ratio": 5 / 6}
    assert q["heuristic_agreement"] == {"count": 9, "of": 12, "ratio": 0.75}
    assert q["audit_consistency"] == {"count": 3, "of": 3, "ratio": 1.0}
    assert (q["audited_groups"], q["audit_unusable"]) == (2, 1)
    assert rep.grader_quality([])["audit_consistency"]["ratio"] is None
