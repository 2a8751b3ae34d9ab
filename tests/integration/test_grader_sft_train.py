"""The grader's SFT (``gagar grader sft``): what it trains on, and that it trains.

The target is the answer a forced ``submit_ranking`` turn decodes (the arguments' JSON, no
``<tool_call>`` wrapper); only it carries loss; the result is an HF folder a grader can serve.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gagar.driver.grader_bench import BenchGroup
from gagar.driver.grader_sft import (
    SftConfig,
    answer,
    batches,
    lr_at,
    progress,
    record,
    split_validation,
    tokenize,
    train,
)
from gagar.grader.sample import sample_group
from gagar.trainer.model.presets import fast_tokenizer
from tests.support.tiny_llama import write_tiny_llama

KINDS = ["clean", "bloated", "tests_edited", "wrong"]  # the sample group's members, as kinds


def _record(perm: list[int], gid: str = "g") -> dict:
    return record(BenchGroup(gid, "train", KINDS, sample_group()), perm)


@pytest.fixture(scope="module")
def tok():
    return fast_tokenizer(vocab_size=1024)


def test_only_the_forced_answer_and_its_end_of_turn_carry_loss(tok):
    rec = _record([3, 2, 0, 1])
    ids, mask = tokenize(rec, tok)
    assert len(ids) == len(mask) and mask == sorted(mask)  # a prompt, then the answer
    target = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert target == answer(rec) + tok.eos_token
    assert "<tool_call>" not in target  # a named tool choice decodes the arguments alone
    (submit,) = [t for t in rec["tools"] if t["function"]["name"] == "submit_ranking"]
    jsonschema.validate(json.loads(answer(rec)), submit["function"]["parameters"])
    served = tok.apply_chat_template(
        rec["messages"][:-1], tools=rec["tools"], add_generation_prompt=True, tokenize=False
    )
    prompt = tok(served, add_special_tokens=False)["input_ids"]
    assert ids[: len(prompt)] == prompt and mask.index(1) == len(prompt)  # the server's prompt


def test_batches_are_epochs_with_the_mask_as_advantage():
    encoded = [([i] * 3, [0, 1, 1]) for i in range(5)]
    out = batches(encoded, steps=5, size=2, seed=0)
    seen = [s.token_ids[0] for batch in out for s in batch]
    assert len(out) == 5 and all(len(b) == 2 for b in out)
    assert sorted(seen) == sorted(list(range(5)) * 2)  # each record once a pass, two passes
    assert all(s.advantages == [0.0, 1.0, 1.0] for b in out for s in b)
    assert seen != [s.token_ids[0] for b in batches(encoded, 5, 2, seed=1) for s in b]


def test_sft_lowers_the_answers_nll_and_writes_a_servable_folder(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    from gagar.driver.local import init_one_process

    base = write_tiny_llama(tmp_path / "base")
    init_one_process()
    recs = [_record([0, 1, 2, 3], "a"), _record([2, 0, 3, 1], "b")]
    out = tmp_path / "grader"
    cfg = SftConfig(steps=12, batch=2, lr=3e-3, max_tokens=4096, warmup=1, val_groups=0)
    summary = train(recs, base, out, cfg)
    nll = summary["nll_per_step"]
    assert len(nll) == 12 and nll[-1] < 0.5 * nll[0], nll
    assert summary["validations"] == [] and summary["chosen"] is None  # no group kept out
    assert summary["trained_on"] == 2 and summary["groups"] == ["a", "b"]
    assert json.loads((out / "grader_sft.json").read_text())["nll_per_step"] == nll
    model = AutoModelForCausalLM.from_pretrained(out)  # the folder spec.grader.model takes
    assert (out / "tokenizer.json").is_file() and model.config.vocab_size == 1024


def test_the_schedule_warms_up_then_decays_to_a_tenth_by_steps_or_by_the_clock():
    cfg = SftConfig(steps=10, lr=1.0, warmup=2, minutes=1.0)
    assert [lr_at(s, 0.0, cfg) for s in (0, 1)] == [0.5, 1.0]
    assert lr_at(2, 0.0, cfg) == 1.0 and lr_at(5, 1.0, cfg) == pytest.approx(0.1)
    assert progress(5, 0.0, cfg) == 0.5 and progress(1, 45.0, cfg) == 0.75  # the clock leads
    assert progress(3, 0.0, SftConfig(steps=10)) == 0.3  # no budget: steps alone


def test_validation_groups_are_kept_out_whole_and_pick_the_weights(tmp_path: Path):
    """Records of the validation groups are never trained on; they are scored every
    ``eval_every`` steps and the weights written are the best-scored ones."""
    from gagar.driver.local import init_one_process

    recs = [_record(p, g) for g in ("a", "b", "c") for p in ([0, 1, 2, 3], [2, 0, 3, 1])]
    train_recs, val_recs = split_validation(recs, 1, seed=0)
    (held,) = {r["group_id"] for r in val_recs}
    assert len(val_recs) == 2 and held not in {r["group_id"] for r in train_recs}
    base = write_tiny_llama(tmp_path / "base")
    init_one_process()
    cfg = SftConfig(steps=6, batch=2, lr=3e-3, warmup=1, val_groups=1, eval_every=2)
    summary = train(recs, base, tmp_path / "out", cfg)
    assert [v["step"] for v in summary["validations"]] == [2, 4, 6]
    assert summary["validation_groups"] == [held] and held not in summary["groups"]
    best = min(summary["validations"], key=lambda v: (-v["exact"], v["nll"]))
    assert summary["chosen"] == best
    assert summary["trained_on"] == 4 and summary["validation_records"] == 2


def test_records_too_long_are_left_out_and_counted(tmp_path: Path):
    from gagar.driver.local import init_one_process

    base = write_tiny_llama(tmp_path / "base")
    init_one_process()
    with pytest.raises(ValueError, match="longer than 100 tokens"):
        cfg = SftConfig(steps=1, max_tokens=100, val_groups=0)
        train([_record([0, 1, 2, 3])], base, tmp_path / "out", cfg)


def test_the_commands_defaults_are_the_configs():
    """``gagar grader sft --help`` states SftConfig's defaults (argparse leaves them unset)."""
    import argparse

    from gagar.driver.grader_eval import register_sft

    sub = argparse.ArgumentParser().add_subparsers()
    register_sft(sub)
    helps = {a.dest: a.help for a in sub.choices["sft"]._actions}
    cfg = SftConfig()
    for dest in (
        "steps", "batch", "lr", "max_tokens", "dtype", "warmup", "val_groups", "eval_every",
        "minutes",
    ):  # fmt: skip
        assert f"(default {getattr(cfg, dest)})" in helps[dest], (dest, helps[dest])


def test_the_command_trains_from_sft_data_records(tmp_path: Path, capsys):
    """`gagar grader sft --data FILE --model DIR`: a log line per 5 % where no bar is drawn."""
    from gagar.cli import main

    base = write_tiny_llama(tmp_path / "base")
    data = tmp_path / "recs.jsonl"
    data.write_text("".join(json.dumps(_record(p, g)) + "\n" for p, g in
                            (([0, 1, 2, 3], "a"), ([1, 0, 3, 2], "b"))))  # fmt: skip
    out = tmp_path / "grader"
    args = ["grader", "sft", "--data", str(data), "--model", str(base), "--out", str(out)]
    assert main([*args, "--steps", "2", "--batch", "2", "--lr", "1e-3", "--val-groups", "0"]) == 0
    printed = capsys.readouterr().out
    assert "grader SFT step 2/2: nll/token" in printed and "2 records (0 too long)" in printed
    assert len(json.loads((out / "grader_sft.json").read_text())["nll_per_step"]) == 2
    with pytest.raises(Exception, match="neither a preset nor an HF folder"):
        main([*args[:-4], "--model", str(tmp_path / "nowhere"), "--out", str(out)])
