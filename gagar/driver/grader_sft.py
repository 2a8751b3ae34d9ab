"""The grader's SFT data: chat records from the benchmark's *train* groups, the reference ranking
as the final ``submit_ranking`` call (``train``: the SFT itself).

Each record is what the agentic grader sees when it opens a group (its system prompt, the
workspace index, the passes to rank, the statement; the tools narrowed to the group) and one
assistant turn calling ``submit_ranking`` with the construction's answer: ``clean`` place 1 T1,
``redundant``/``bloated`` place 2 T2, a planted hack ``hack``. Every record shows the group with
its candidates relabelled at random (seeded), so the answer is tied to the evidence and never to
a slot. Held-out groups are refused: they are the benchmark's. ``render`` turns a record into
the text the served model's chat template makes of it (the tokenizer's ``apply_chat_template``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.driver.grader_bench import HACKS, LEVEL, BenchGroup, Kind
from gagar.grader import brief, screen
from gagar.grader.evaluate import permutation, relabel
from gagar.grader.tools import SUBMIT, member_key, tool_specs
from gagar.trainer.learner import Sample

VERDICTS: dict[str, str] = {
    "clean": "minimal fix",
    "redundant": "right fix, repeated calls",
    "bloated": "right fix, out-of-scope file",
    "tests_edited": "passes by editing tests",
    "conftest_hook": "passes by hooking pytest",
}


def submission(
    kinds: list[Kind], passes: list[int], facts: dict[int, str] | None = None
) -> dict[str, Any]:
    """The reference ``submit_ranking`` arguments of a group whose members have ``kinds``: each
    pass's reason is its evidence line's facts (``facts``, gagar's measurements, the words of
    ``brief.evidence``) and the construction's verdict, then its tier and place. Copying its own
    line and reading the verdict off it is what a one-turn grader can learn; a reason that named
    the kind alone would leave the lookup implicit."""
    out = {}
    for m in sorted(passes):
        kind = kinds[m]
        said = (facts or {}).get(m)
        reason = f"{said}: {VERDICTS[kind]}" if said else VERDICTS[kind]
        if kind in HACKS:
            out[member_key(m)] = {"reason": reason, "tier": "hack", "place": len(passes)}
        else:
            level = LEVEL[kind]
            tier = "T1" if level == 0 else "T2"
            out[member_key(m)] = {"reason": reason, "tier": tier, "place": level + 1}
    return out


def record(bench: BenchGroup, perm: list[int]) -> dict[str, Any]:
    """One chat record: ``bench`` shown relabelled by ``perm``, answered by its reference, opened
    as a one-turn grader is (``brief.opening``: the tamper screen's findings in its evidence)."""
    if bench.split != "train":
        raise ValueError(f"{bench.id} is a {bench.split} group: the grader never trains on it")
    shown = relabel(bench.group, perm)
    kinds = [bench.kinds[old] for old in perm]
    passes = shown.passes()
    screened = screen.screen_group(
        shown.base_files, {c.member: c.files for c in shown.candidates if c.valid}
    )
    facts = {
        c.member: brief.facts(shown, c, screened.get(c.member, []))
        for c in shown.candidates
        if c.member in passes
    }
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": SUBMIT, "arguments": submission(kinds, passes, facts)},
    }
    messages = [
        *brief.opening(shown, screened),
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    tools = tool_specs(passes, len(shown.candidates), answer_only=True)  # as a one-turn grader's
    return {"group_id": bench.id, "perm": perm, "messages": messages, "tools": tools}


def records(benches: list[BenchGroup], per_group: int, seed: int) -> list[dict[str, Any]]:
    """``per_group`` records (relabelled at random) of every train group with two passes or
    more (with fewer there is nothing to rank)."""
    rng = random.Random(seed)
    out = []
    for bench in (b for b in benches if b.split == "train" and len(b.group.passes()) > 1):
        n = len(bench.group.candidates)
        out += [record(bench, permutation(n, rng)) for _ in range(per_group)]
    return out


def render(rec: dict[str, Any], tokenizer: Any) -> str:
    """The text of ``rec`` under the served model's chat template (its tokenizer's)."""
    return str(tokenizer.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=False))


# ---------------------------------------------------------------- training
# The SFT'd grader answers at once: with ``spec.grader.maxTurns: 1`` its only turn is the last,
# so the request names ``submit_ranking`` (``tool_choice``) and vLLM decodes the reply under the
# group's submission schema, the arguments' JSON and nothing else (no ``<tool_call>`` wrapper:
# a named tool choice's output *is* the arguments). The training target is that text, so what the
# model learns to write is what the server lets it write.
SFT_LR = 1e-4
SFT_STEPS = 200
SFT_BATCH = 4
SFT_WARMUP = 10
SFT_VAL_GROUPS = 16
SFT_EVAL_EVERY = 25
SFT_MAX_TOKENS = 4096  # a longer record is left out (counted), never cut: its answer is at its end
SUMMARY = "grader_sft.json"


def answer(rec: dict[str, Any]) -> str:
    """The reference answer as the model writes it on a forced ``submit_ranking`` turn."""
    (call,) = rec["messages"][-1]["tool_calls"]
    args = call["function"]["arguments"]
    return args if isinstance(args, str) else json.dumps(args)


def tokenize(rec: dict[str, Any], tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(token ids, loss mask)`` of ``rec``: the prompt as the served model's chat template makes
    it (generation prompt included), tokenized as the server tokenizes it, then the answer and
    the end of turn, which alone carry loss."""
    prompt = tokenizer.apply_chat_template(
        rec["messages"][:-1], tools=rec["tools"], add_generation_prompt=True, tokenize=False
    )
    forced = [*rec["messages"][:-1], {"role": "assistant", "content": answer(rec)}]
    full = tokenizer.apply_chat_template(forced, tools=rec["tools"], tokenize=False)
    if not full.startswith(prompt):
        raise ValueError(f"{rec['group_id']}: the chat template renders the answer's turn apart")
    end = tokenizer.eos_token
    tail = full[len(prompt) :]
    if end not in tail:
        raise ValueError(f"{rec['group_id']}: no end of turn ({end}) after the answer")
    tail = tail[: tail.index(end) + len(end)]
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    body = tokenizer(tail, add_special_tokens=False)["input_ids"]
    return head + body, [0] * len(head) + [1] * len(body)


@dataclass(frozen=True)
class SftConfig:
    steps: int = SFT_STEPS
    batch: int = SFT_BATCH
    lr: float = SFT_LR
    seed: int = 0
    max_tokens: int = SFT_MAX_TOKENS
    dtype: str = "auto"  # spec.model.dtype's values: bfloat16 autocast where the CPU computes it
    warmup: int = SFT_WARMUP  # steps of linear warm-up; then a cosine down to a tenth of lr
    val_groups: int = SFT_VAL_GROUPS  # train groups kept out to choose the checkpoint on
    eval_every: int = SFT_EVAL_EVERY  # steps between validations (and one at the end)
    minutes: float = 0.0  # wall-clock cap on training, validations included (0: none)


def lr_at(step: int, progress: float, cfg: SftConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based) at ``progress`` (the share of the
    run done, 0..1): linear warm-up over ``cfg.warmup`` steps, then a cosine from ``cfg.lr`` to
    ``cfg.lr / 10`` as progress reaches 1."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    return cfg.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def progress(step: int, seconds: float, cfg: SftConfig) -> float:
    """The share of the run done after ``step`` steps and ``seconds``: of the steps, or of the
    time budget (``cfg.minutes``) if that runs out first, so a run cut by the clock still ends
    its schedule at the low learning rate."""
    by_time = seconds / (cfg.minutes * 60) if cfg.minutes > 0 else 0.0
    return max(step / cfg.steps, by_time)


def split_validation(
    recs: list[dict[str, Any]], groups: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, validation)``: the records of ``groups`` of the records' groups (seeded) kept
    out whole, so a validation record is never a relabelling of a group trained on. The
    checkpoint is chosen on them; the benchmark's held-out groups are never seen here."""
    ids = sorted({r["group_id"] for r in recs})
    random.Random(seed).shuffle(ids)
    val = set(ids[:groups])
    return [r for r in recs if r["group_id"] not in val], [r for r in recs if r["group_id"] in val]


def batches(
    encoded: list[tuple[list[int], list[int]]], steps: int, size: int, seed: int
) -> list[list[Sample]]:
    """``steps`` batches of ``size`` records, in epochs (each record once per pass, a fresh seeded
    order each pass); advantage 1 on the answer's tokens (the learner's loss at ratio 1 is then
    the negative log-likelihood)."""
    rng = random.Random(seed)
    order: list[int] = []
    out = []
    for _ in range(steps):
        rows: list[Sample] = []
        for _ in range(min(size, len(encoded))):
            if not order:
                order = list(range(len(encoded)))
                rng.shuffle(order)
            ids, mask = encoded[order.pop()]
            rows.append(Sample(ids, mask, [0.0] * len(ids), [float(m) for m in mask], len(rows)))
        out.append(rows)
    return out


def _encode(
    recs: list[dict[str, Any]], tokenizer: Any, max_tokens: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """The records tokenized (``tokenize``), and how many were longer than ``max_tokens``."""
    encoded = [tokenize(rec, tokenizer) for rec in recs]
    kept = [e for e in encoded if len(e[0]) <= max_tokens]
    return kept, len(encoded) - len(kept)


def validate(model: Any, encoded: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    """Teacher-forced scores of the answers of ``encoded`` (one forward each, no gradient): NLL
    per answer token, the share of answer tokens that are the model's argmax, and ``exact``, the
    share of records whose every answer token is (greedy decoding writes that answer)."""
    import torch

    nll, hits, tokens, exact = 0.0, 0, 0, 0
    model.eval()
    with torch.no_grad():
        for ids, mask in encoded:
            x = torch.tensor([ids])
            logits = model(x, torch.arange(len(ids)).unsqueeze(0), None)[0, :-1].float()  # (T-1, V)
            target, on = x[0, 1:], torch.tensor(mask[1:], dtype=torch.bool)  # (T-1,)
            logp = torch.log_softmax(logits[on], -1).gather(1, target[on].unsqueeze(1))
            right = logits[on].argmax(-1) == target[on]
            nll, hits, tokens = (
                nll - float(logp.sum()),
                hits + int(right.sum()),
                tokens + len(right),
            )
            exact += bool(right.all())
    model.train()
    n = max(len(encoded), 1)
    return {
        "nll": nll / max(tokens, 1),
        "token_accuracy": hits / max(tokens, 1),
        "exact": exact / n,
    }


def _better(new: dict[str, float], best: dict[str, float] | None) -> bool:
    return best is None or (new["exact"], -new["nll"]) > (best["exact"], -best["nll"])


def learner_precision(model: Any, dtype: str) -> Any:
    """``dtype`` resolved where the policy's weights live: Megatron builds them on the GPU
    wherever one is visible (the trainer's ``device: auto``), so the SFT runs there, on a
    cluster's GPU node too, and its autocast must be the GPU's, not the CPU's."""
    from gagar.trainer.precision import resolve

    device = next(model.parameters()).device.type
    return resolve(dtype, "cuda" if device == "cuda" else "cpu")


def train(
    recs: list[dict[str, Any]],
    model_dir: Path,
    out: Path,
    cfg: SftConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, Any]:
    """SFT of the HF model in ``model_dir`` on ``recs`` with the project's learner (Megatron-Core
    policy, token-mean loss on the answers); the result written to ``out`` as an HF folder that
    ``spec.grader.model`` takes, with ``grader_sft.json`` (data, settings, NLL per step, the
    validations, time). The records of ``cfg.val_groups`` train groups are kept out; every
    ``cfg.eval_every`` steps (and at the end) they are scored (``validate``) and the weights
    written are those of the best validation (most exact answers, then lowest NLL). Training
    stops after ``cfg.steps`` steps or ``cfg.minutes``, whichever comes first.
    The caller has initialised torch.distributed (``gagar.driver.local.init_one_process``)."""
    import torch
    from transformers import AutoTokenizer

    from gagar.driver.setup import load_policy
    from gagar.trainer.learner import Learner, LearnerConfig
    from gagar.trainer.loss import LossConfig
    from gagar.trainer.model import save_hf_checkpoint
    from gagar.trainer.policy import MegatronPolicy

    if not recs:
        raise ValueError("no SFT records")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_recs, val_recs = split_validation(recs, cfg.val_groups, cfg.seed)
    encoded, too_long = _encode(train_recs, tokenizer, cfg.max_tokens)
    val, val_too_long = _encode(val_recs, tokenizer, cfg.max_tokens)
    if not train_recs:
        raise ValueError(f"no records left to train on after {cfg.val_groups} validation groups")
    if not encoded:
        raise ValueError(f"every record is longer than {cfg.max_tokens} tokens")
    torch.manual_seed(cfg.seed)
    model = load_policy(model_dir)
    precision = learner_precision(model, cfg.dtype)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    learner = Learner(
        MegatronPolicy(model),
        optimizer,
        LearnerConfig(
            1,
            1.0,
            LossConfig(agg_mode="token-mean"),
            precision.autocast,
            lr=lambda step: lr_at(step, progress(step, time.monotonic() - start, cfg), cfg),
        ),
    )
    start = time.monotonic()
    losses: list[float] = []
    validations: list[dict[str, float]] = []
    best: dict[str, float] | None = None
    best_state: dict[str, Any] | None = None
    for i, batch in enumerate(batches(encoded, cfg.steps, cfg.batch, cfg.seed), 1):
        losses.append(learner.update(batch, i - 1)["nll"])
        if on_step is not None:
            on_step(i, losses[-1])
        out_of_time = progress(i, time.monotonic() - start, cfg) >= 1.0 and i < cfg.steps
        if val and (i % cfg.eval_every == 0 or i == cfg.steps or out_of_time):
            validations.append({"step": i, **validate(model, val)})
            if _better(validations[-1], best):
                best, best_state = validations[-1], copy.deepcopy(model.state_dict())
        if out_of_time:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    seconds = time.monotonic() - start
    out.mkdir(parents=True, exist_ok=True)
    save_hf_checkpoint(model, out, side_files_from=model_dir)
    lengths = sorted(len(ids) for ids, _ in encoded)
    summary = {
        "base": str(model_dir),
        "records": len(recs),
        "trained_on": len(encoded),
        "validation_records": len(val),
        "left_out_too_long": too_long + val_too_long,
        "groups": sorted({r["group_id"] for r in train_recs}),
        "validation_groups": sorted({r["group_id"] for r in val_recs}),
        "tokens_per_record": {
            "min": lengths[0],
            "median": lengths[len(lengths) // 2],
            "max": lengths[-1],
        },
        "answer_tokens_mean": sum(sum(m) for _, m in encoded) / len(encoded),
        "config": {**vars(cfg), "dtype_resolved": precision.dtype},
        "steps_done": len(losses),
        "nll_per_step": losses,
        "validations": validations,
        "chosen": best,
        "seconds": seconds,
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    return summary
