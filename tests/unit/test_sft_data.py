"""What the SFT warm start learns from: which tasks the experts solve, and how their turns tokenize."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gagar.driver import components as comp
from gagar.driver.rollouts import task_messages
from gagar.driver.setup import FRESH_SYNTHETIC_SEED, SFT_EXPERT_TASKS, sft_tasks
from gagar.driver.sft import STYLES, expert_turns
from gagar.rollout.envs import synthetic
from gagar.spec import GagarRun

ROOT = Path(__file__).resolve().parents[2]
LOCAL = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())


def _run(sft_steps: int, size: int, expert_tasks: int | None = None) -> GagarRun:
    spec = {**LOCAL["spec"]}
    model = {k: v for k, v in spec["model"].items() if k != "sftExpertTasks"}
    if expert_tasks is not None:
        model["sftExpertTasks"] = expert_tasks
    spec["model"] = {**model, "sftWarmupSteps": sft_steps}
    spec["dataset"] = {**spec["dataset"], "sources": [{"kind": "synthetic", "size": size}]}
    return GagarRun.model_validate({**LOCAL, "spec": spec})


@pytest.mark.parametrize(("steps", "expected"), [(2, 16), (16, 32), (150, 300), (10_000, 512)])
def test_sft_tasks_scale_with_steps(steps: int, expected: int) -> None:
    assert SFT_EXPERT_TASKS == (16, 512)
    run = _run(steps, size=128)
    train, held = comp.load_datasets(run.spec.dataset)
    tasks = sft_tasks(run, train)
    assert len(tasks) == expected
    assert len({t.instance_id for t in tasks}) == expected
    # the run's own training tasks come first, in order
    k = min(expected, len(train))
    assert [t.instance_id for t in tasks[:k]] == [t.instance_id for t in train[:k]]
    # the top-up never touches a task of the dataset, held-out split included
    fresh = tasks[k:]
    dataset_ids = {t.instance_id for t in [*train, *held]}
    assert not {t.instance_id for t in fresh} & dataset_ids
    assert all(t.metadata["seed"] >= FRESH_SYNTHETIC_SEED for t in fresh)


def test_sft_expert_tasks_overrides_the_step_scaling() -> None:
    run = _run(400, size=64, expert_tasks=64)
    train, _ = comp.load_datasets(run.spec.dataset)
    tasks = sft_tasks(run, train)
    assert len(tasks) == 64
    assert [t.instance_id for t in tasks[: len(train)]] == [t.instance_id for t in train]
    assert len(train) == 48, "examples/local.yaml: RL starts on tasks the SFT has seen"


def test_whole_sequence_sft_trains_every_token_after_the_first() -> None:
    from gagar.driver.sft import sft_batches
    from gagar.rollout.agent import Trajectory

    traj = Trajectory([5, 6, 7, 8], [0.0] * 4, [0, 0, 1, 1], prompt_len=2, messages=[])
    (generated,) = sft_batches([traj], 1, batch_size=1)
    (whole,) = sft_batches([traj], 1, batch_size=1, whole_sequence=True)
    assert generated[0].loss_mask == [0, 0, 1, 1] and generated[0].advantages == [0, 0, 1, 1]
    assert whole[0].loss_mask == [0, 1, 1, 1] and whole[0].advantages == [0, 1, 1, 1]
    assert whole[0].token_ids == traj.token_ids


def test_sft_top_up_skips_seeds_a_source_uses() -> None:
    run = _run(150, size=8)
    doc = run.model_dump(by_alias=True)
    doc["spec"]["dataset"]["sources"].append(
        {"kind": "synthetic", "size": 10, "seed": FRESH_SYNTHETIC_SEED + 5}
    )
    run = GagarRun.model_validate(doc)
    train, _ = comp.load_datasets(run.spec.dataset)
    seeds = [t.metadata["seed"] for t in sft_tasks(run, train)[len(train) :]]
    assert not set(seeds) & set(range(FRESH_SYNTHETIC_SEED + 5, FRESH_SYNTHETIC_SEED + 15))


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from gagar.trainer.model.presets import create_preset

    out = create_preset("tiny", tmp_path_factory.mktemp("tiny"), texts=comp._tokenizer_corpus())
    return AutoTokenizer.from_pretrained(out)


def test_every_expert_turn_fits_the_local_turn_budget(tiny_tokenizer) -> None:
    """A turn the policy cannot finish within maxTokensPerTurn is a tool call it can never make."""
    budget = LOCAL["spec"]["rollout"]["agent"]["maxTokensPerTurn"]
    longest = max(
        len(tiny_tokenizer.encode(turn, add_special_tokens=False)) + 1  # + end of turn
        for task in synthetic.generate_many(300, seed=FRESH_SYNTHETIC_SEED)
        for style in STYLES
        for turn in expert_turns(task, style)
    )
    assert longest <= budget


def test_tiny_tokenizer_is_trained_on_the_agent_chat(tiny_tokenizer) -> None:
    """Tool-call JSON and the task prompt get compact tokens: the names the policy must copy from the
    problem statement are single tokens, and the scaffold around them is a few."""
    task = synthetic.generate(7)
    pieces = lambda s: [  # noqa: E731
        tiny_tokenizer.decode([i]) for i in tiny_tokenizer.encode(s, add_special_tokens=False)
    ]
    package, module = task.repo.split("/")[1], task.problem_statement.split("`")[1].split(".")[1]
    assert package in pieces(task.problem_statement) and module in pieces(task.problem_statement)
    # 31 pieces when the tokenizer saw only the repositories' files
    assert len(pieces('<tool_call>\n{"name": "edit", "arguments": {"path": "')) <= 16
    text = tiny_tokenizer.apply_chat_template(
        task_messages(task), tokenize=False, add_generation_prompt=True
    )
    # 1.9 characters per token when the tokenizer saw only the repositories' files
    assert len(text) / len(pieces(text)) > 3.0


def test_sft_lr_defaults_to_from_scratch_or_fine_tuning() -> None:
    from gagar.driver.sft import SFT_LR, SFT_LR_PRETRAINED, sft_lr
    from gagar.spec import ModelSpec

    assert sft_lr(ModelSpec(preset="tiny")) == SFT_LR == 1e-3
    assert sft_lr(ModelSpec(preset="smollm2-135m")) == SFT_LR_PRETRAINED == 1e-5
    assert sft_lr(ModelSpec(path="/models/x")) == SFT_LR_PRETRAINED
    assert sft_lr(ModelSpec(preset="smollm2-135m", sft_lr=3e-5)) == 3e-5
    with pytest.raises(ValueError, match=r"sftLr|sft_lr"):
        GagarRun.model_validate(
            {**LOCAL, "spec": {**LOCAL["spec"], "model": {"preset": "tiny", "sftLr": 0}}}
        )


def test_tiny_base_policy_is_never_left_half_made(tmp_path: Path, monkeypatch) -> None:
    from gagar.trainer.model import presets

    calls = []

    def killed(name, out, **kw):  # the curriculum dies after the tokenizer was written
        Path(out).mkdir(parents=True)
        (Path(out) / "tokenizer.json").write_text("{}")
        raise KeyboardInterrupt

    def whole(name, out, **kw):
        calls.append(kw["curriculum"].steps)
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        return Path(out)

    run = _run(2, size=8)
    monkeypatch.setattr(presets, "create_preset", killed)
    with pytest.raises(KeyboardInterrupt):
        comp.prepare_policy(run.spec.model, tmp_path)
    assert not (tmp_path / "policy" / "base").exists()
    monkeypatch.setattr(presets, "create_preset", whole)
    base = comp.prepare_policy(run.spec.model, tmp_path)
    assert base == tmp_path / "policy" / "base" and (base / "config.json").exists()
    assert not (tmp_path / "policy" / "base.partial").exists()
    assert calls == [LOCAL["spec"]["model"]["copyCurriculumSteps"]]
    assert comp.prepare_policy(run.spec.model, tmp_path) == base and len(calls) == 1


def test_expert_style_mix_comes_from_the_spec() -> None:
    from collections import Counter

    from gagar.driver.sft import draw_styles, style_weights
    from gagar.spec import ExpertStyles

    default = style_weights(None)
    assert default == {"clean": 0.4, "bloated": 0.25, "redundant": 0.2, "wrong": 0.15}
    assert draw_styles(8, 0, default) == draw_styles(8, 0, default), "seeded"
    only = style_weights(ExpertStyles(clean=0, bloated=1, redundant=0, wrong=0))
    assert set(draw_styles(50, 0, only)) == {"bloated"}
    counts = Counter(
        draw_styles(4000, 1, style_weights(ExpertStyles(clean=1, bloated=3, redundant=0, wrong=0)))
    )
    assert set(counts) == {"clean", "bloated"} and 2.6 < counts["bloated"] / counts["clean"] < 3.4
    run = _run(4, size=16)
    assert run.spec.model.sft_expert_styles is None  # examples/local.yaml: the default mix
    spec = {
        **LOCAL["spec"],
        "model": {**LOCAL["spec"]["model"], "sftExpertStyles": {"bloated": 0.7}},
    }
    styles = GagarRun.model_validate({**LOCAL, "spec": spec}).spec.model.sft_expert_styles
    assert style_weights(styles)["bloated"] == 0.7 and style_weights(styles)["clean"] == 0.4
