"""The grading benchmark end to end: groups built by scripted experts in bubblewrap sandboxes,
cached with their split, graded by the heuristic and by an OpenAI-compatible endpoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.driver import grader_bench, grader_eval
from gagar.grader.evaluate import Graded, score_group
from gagar.grader.protocol import HeuristicGrader
from tests.support.fake_openai import FakeOpenAI, tool_call

pytest.importorskip("gagar.sandbox.local")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grader-bench")
    grader_eval.groups(4, 0, root)
    return root


def test_every_kind_in_one_group_has_its_known_answer():
    """One task, every kind of member: the verification passes and fails them as their kind
    says, the planted hacks pass with their forgery in the files, and the reference orders
    clean above redundant and bloated; the heuristic grader agrees with it."""
    from gagar.rollout.envs import synthetic

    kinds = ["bloated", "tests_edited", "clean", "wrong", "conftest_hook", "redundant"]
    factory, fmt, eos, cfg = grader_eval._machinery()
    task = synthetic.generate(grader_bench.EVAL_SEED_BASE + 77)
    group = asyncio.run(grader_bench.build_group(task, kinds, factory, fmt, eos, cfg))
    assert [c.passed for c in group.candidates] == [True, True, True, False, True, True]
    assert "conftest.py" in group.candidates[4].files and "conftest.py" in group.candidates[4].patch
    tests = [p for p in group.candidates[1].files if "test_" in p]
    assert tests and all(
        "assert True" in group.candidates[1].files[p] for p in tests
    )  # the tests' assertions edited away
    bench = grader_bench.BenchGroup("x", "held_out", kinds, group)
    ref = bench.reference()
    assert ref.levels == {0: 1, 2: 0, 5: 1} and ref.hacks == {1, 4}
    ranking = HeuristicGrader().grade_sync(group)
    score = score_group(ref, [Graded(ranking, list(range(6)), 0.0)])
    assert score.credit == score.pairs and score.hacks_found == 2 == score.hacks_claimed


def test_groups_are_cached_with_a_split_fixed_by_the_seed(cache: Path):
    path = grader_bench.cache_path(cache, 4, 0)
    groups = grader_bench.load_groups(path)
    split = json.loads(path.with_suffix(".split.json").read_text())
    assert split["held_out"] == [g.id for g in groups if g.split == "held_out"]
    assert set(split["train"]).isdisjoint(split["held_out"]) and len(split["held_out"]) == 2
    assert [g.split for g in groups] == grader_bench.splits(4, 0)
    for g in groups:  # kinds say who passes
        assert [c.passed for c in g.group.candidates] == [k != "wrong" for k in g.kinds]
    again = grader_eval.groups(4, 0, cache)  # from the cache, not rebuilt
    assert [g.to_json() for g in again] == [g.to_json() for g in groups]


def _first_slot_best(body: dict) -> dict:
    """A grader model with the worst slot bias: places the passes in the order it is shown."""
    (submit,) = [t for t in body["tools"] if t["function"]["name"] == "submit_ranking"]
    keys = submit["function"]["parameters"]["required"]
    placed = {
        k: {"place": i + 1, "tier": "T1", "reason": "shown first"} for i, k in enumerate(keys)
    }
    return tool_call("submit_ranking", placed)


def test_eval_command_with_the_heuristic_and_an_endpoint(cache: Path, tmp_path: Path, capsys):
    out, log = tmp_path / "eval.json", tmp_path / "episodes.jsonl"
    with FakeOpenAI([_first_slot_best] * 16) as fake:
        rc = main(
            [
                *("grader", "eval", "--groups", "4", "--cache", str(cache), "--shuffles", "3"),
                *("--endpoint", fake.base_url, "--model", "scripted", "--sandbox", "unsafe-local"),
                *("--episodes", str(log), "--out", str(out)),
            ]
        )
    assert rc == 0 and "pair acc" in capsys.readouterr().out
    result = json.loads(out.read_text())
    heuristic, model = result["rows"]["heuristic"], result["rows"]["agentic scripted"]
    assert result["group_ids"] == ["s0-0", "s0-2"]  # the held-out split only
    assert heuristic["usable_rate"] == 1.0 and heuristic["pairwise_accuracy"] == 1.0
    assert heuristic["consistency"] == 1.0 and heuristic["tokens_per_group"] == 0
    assert model["usable_rate"] == 1.0 and model["first_slot_wins"] == 1.0
    assert model["consistency"] < 1.0 and model["tokens_per_group"] == 110
    assert model["pairwise_accuracy"] < heuristic["pairwise_accuracy"]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 * 2 * 4  # two rows, two groups, four gradings each
    agentic = [r for r in records if r["grader"] == "agentic"]
    assert len(agentic) == 8 and all(r["messages"] and r["workspace_index"] for r in agentic)
    assert agentic[0]["messages"][-1]["tool_calls"][0]["function"]["name"] == "submit_ranking"
    assert all(r["messages"] is None for r in records if r["grader"] == "heuristic")


def test_eval_serves_a_grader_folder_for_one_turn(cache: Path, tmp_path: Path, monkeypatch):
    """``--serve DIR --max-turns 1``: DIR served as gagar train serves a grader's model (its
    tool-call parser, the served name), the row named by DIR, one forced answering turn each."""
    from gagar.driver import grader_model
    from gagar.rollout.engines import server as server_mod
    from gagar.spec import GRADER_SERVED_NAME

    folder = tmp_path / "my-grader"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    started: list = []

    with FakeOpenAI([_first_slot_best] * 8) as fake:

        class Served:  # stands in for vLLM: the fake OpenAI server is "its" endpoint
            def __init__(self, cfg, log):
                started.append((cfg, log))

            base_url = fake.base_url.removesuffix("/v1")

            def launch(self):
                return self

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                started.append("stopped")

        monkeypatch.setattr(server_mod, "VllmServer", Served)
        monkeypatch.setattr(grader_model, "ready", lambda server: None)
        out = tmp_path / "eval.json"
        rc = main(
            [
                *("grader", "eval", "--groups", "4", "--cache", str(cache), "--shuffles", "1"),
                *("--serve", str(folder), "--max-turns", "1", "--sandbox", "unsafe-local"),
                *("--no-heuristic", "--out", str(out)),
            ]
        )
        requests = fake.requests
    assert rc == 0 and started[-1] == "stopped"
    (cfg, log), _ = started
    assert cfg.model == folder and cfg.served_name == GRADER_SERVED_NAME and cfg.tool_call_parser
    assert log.parent == tmp_path
    row = json.loads(out.read_text())["rows"]["agentic my-grader"]
    assert row["usable_rate"] == 1.0
    assert len(requests) == 2 * 2  # two held-out groups, graded twice: one turn each
    for body in requests:
        assert body["model"] == GRADER_SERVED_NAME
        assert body["tool_choice"] == {"type": "function", "function": {"name": "submit_ranking"}}
        assert [t["function"]["name"] for t in body["tools"]] == ["submit_ranking"]
