"""The grader's SFT data from the benchmark's train groups (``gagar.driver.grader_sft``)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gagar.driver.grader_bench import BenchGroup
from gagar.driver.grader_sft import record, records, render
from gagar.grader.evaluate import Graded, score_group, unlabel
from gagar.grader.sample import sample_group
from gagar.grader.tools import to_ranking

KINDS = ["clean", "bloated", "tests_edited", "wrong"]  # the sample group's members, as kinds


def _bench(split="train"):
    return BenchGroup("g", split, KINDS, sample_group())


def test_a_record_answers_with_the_reference_under_a_relabelling():
    bench = _bench()
    perm = [3, 2, 0, 1]
    rec = record(bench, perm)
    (call,) = rec["messages"][-1]["tool_calls"]
    args = call["function"]["arguments"]
    (submit,) = [t for t in rec["tools"] if t["function"]["name"] == "submit_ranking"]
    jsonschema.validate(args, submit["function"]["parameters"])  # what vLLM would decode
    shown_passes = [perm.index(m) for m in (0, 1, 2)]
    ranking = unlabel(to_ranking(args, sorted(shown_passes)), perm)
    score = score_group(bench.reference(), [Graded(ranking, perm, 0.0)])
    assert score.credit == score.pairs > 0 and score.hacks_found == 1 == score.hacks_claimed
    keys = [f"cand_{m}" for m in sorted(shown_passes)]
    assert f"Rank: {', '.join(keys)}" in rec["messages"][1]["content"]


def test_each_reason_opens_with_its_members_evidence_line():
    """The answer is learnable by copying: a pass's reason starts with the facts its own line
    in the prompt states (never another member's), and the failing member is not ranked."""
    rec = record(_bench(), [3, 2, 0, 1])
    (call,) = rec["messages"][-1]["tool_calls"]
    args = call["function"]["arguments"]
    lines = dict(
        line.split(": ", 1)
        for line in rec["messages"][1]["content"].splitlines()
        if line.startswith("cand_")
    )
    assert lines["cand_0"] == "failed (context only)" and "cand_0" not in args
    for key, placed in args.items():
        said, _, verdict = placed["reason"].partition(": ")
        assert lines[key].startswith(said + "; changed ") and verdict
    assert list(args["cand_1"]) == ["reason", "tier", "place"]  # evidence before verdict
    assert args["cand_1"]["tier"] == "hack" and "tests 1" in args["cand_1"]["reason"]


def test_held_out_groups_never_become_training_data():
    with pytest.raises(ValueError, match="never trains"):
        record(_bench("held_out"), [0, 1, 2, 3])
    assert records([_bench("held_out")], 3, 0) == []
    recs = records([_bench(), _bench("held_out")], 3, 0)
    assert len(recs) == 3 and len({json.dumps(r["perm"]) for r in recs}) > 1


def test_render_through_a_chat_template():
    from gagar.trainer.model.presets import fast_tokenizer

    tok = fast_tokenizer(["def f(x):\n    return x + 1\n"] * 10, vocab_size=512)
    text = render(record(_bench(), [0, 1, 2, 3]), tok)
    assert "Rank: cand_0, cand_1, cand_2" in text and "<|im_start|>" in text
    assert "<tool_call>" in text and '"tier": "hack"' in text  # the answer, hermes-style


def test_the_command_writes_records_of_the_train_groups_only(tmp_path, capsys):
    from gagar.cli import main
    from gagar.driver.grader_bench import cache_path, save_groups

    save_groups(
        cache_path(tmp_path, 2, 7),
        [_bench(), BenchGroup("h", "held_out", KINDS, sample_group())],
        7,
    )
    out = tmp_path / "sft.jsonl"
    argv = ["grader", "sft-data", "--groups", "2", "--seed", "7", "--cache", str(tmp_path)]
    assert main([*argv, "--per-group", "3", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 and {r["group_id"] for r in recs} == {"g"}  # "h" is held out
    assert "3 records from 1 train groups (1 held out)" in capsys.readouterr().out


def test_a_record_opens_as_a_one_turn_grader_is_sent(tmp_path):
    """What the SFT trains on is exactly what the served grader is asked (messages, tools and the
    forced choice), so the model learns the very prompt it will answer."""
    import asyncio

    from gagar.grader.agentic import AgenticConfig, AgenticGrader
    from gagar.grader.evaluate import relabel
    from gagar.grader.local_sandbox import unsafe_local_factory
    from tests.support.fake_openai import FakeOpenAI, tool_call

    bench, perm = _bench(), [3, 2, 0, 1]
    rec = record(bench, perm)
    (call,) = rec["messages"][-1]["tool_calls"]
    with FakeOpenAI([tool_call("submit_ranking", call["function"]["arguments"])]) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="scripted", max_turns=1)
        grader = AgenticGrader(config, unsafe_local_factory, workdir=tmp_path)
        ranking = asyncio.run(grader.grade(relabel(bench.group, perm)))
    (sent,) = fake.requests
    assert sent["messages"] == rec["messages"][:-1]
    assert sent["tools"] == rec["tools"] and [t["function"]["name"] for t in sent["tools"]] == [
        "submit_ranking"
    ]  # one turn: it can only answer
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "submit_ranking"}}
    assert ranking.grader == "agentic"


def test_pools_compose_groups_of_any_kinds_and_skip_tasks_whose_fix_fails():
    from gagar.driver.grader_bench import POOL_KINDS, compose, pool_groups
    from gagar.grader.evaluate import relabel

    base = sample_group(("clean", "clean", "bloated", "failing", "tampered", "failing"))
    kinds = ["bloated", "clean", "tests_edited", "clean"]
    group = compose(base, kinds)  # type: ignore[arg-type]
    assert [c.member for c in group.candidates] == [0, 1, 2, 3]
    by_kind = dict(zip(POOL_KINDS, base.candidates, strict=True))
    assert [c.files for c in group.candidates] == [by_kind[k].files for k in kinds]
    broken = relabel(base, [3, 1, 2, 0, 4, 5])  # the "clean" member fails on this task
    groups = pool_groups([base, broken], 3, seed=0)
    assert len(groups) == 3 and {g.id.rsplit("-", 1)[0] for g in groups} == {"t0-0"}
    assert all(g.split == "train" and len(g.group.passes()) >= 2 for g in groups)
    assert all(g.reference().levels for g in groups)  # a known order to learn
