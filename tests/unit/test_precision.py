"""``spec.model.dtype``: ``auto`` takes bfloat16 only where the hardware computes it, an emulated
dtype is warned about with its measured cost, and every CPU compute path honours the choice."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console

from gagar.driver import components as comp
from gagar.driver import report, sft
from gagar.driver.setup import announce_precision
from gagar.spec import GagarRun
from gagar.trainer import precision
from gagar.trainer.model.presets import copy_curriculum

ROOT = Path(__file__).resolve().parents[2]
LOCAL = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
CAPS = ("avx2", "avx512", "vnni", "avx512_bf16", "amx_tile", "amx_fp16")


def _cpu(monkeypatch, *present: str, capability: str = "AVX2") -> None:
    """Pretend torch sees a CPU with the ``present`` units (and no masks in the environment)."""
    for cap in CAPS:
        monkeypatch.setattr(torch.cpu, f"_is_{cap}_supported", lambda on=cap in present: on)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)


AMX = ("avx2", "avx512", "vnni", "avx512_bf16", "amx_tile")
ZEN3 = ("avx2",)


def _run(**model) -> GagarRun:
    doc = json.loads(json.dumps(LOCAL))
    doc["spec"]["model"].update(model)
    return GagarRun.model_validate(doc)


def test_auto_is_the_default_and_the_embedded_default_uses_it() -> None:
    doc = json.loads(json.dumps(LOCAL))
    del doc["spec"]["model"]["dtype"]
    assert GagarRun.model_validate(doc).spec.model.dtype == "auto"
    assert LOCAL["spec"]["model"]["dtype"] == "auto"


@pytest.mark.parametrize(
    ("units", "env", "dtype", "why"),
    [
        (AMX, {}, "bfloat16", "natively (AMX and AVX512-BF16)"),
        (("avx2", "avx512", "avx512_bf16"), {}, "bfloat16", "natively (AVX512-BF16)"),
        (ZEN3, {}, "float32", "no AMX or AVX512-BF16"),
        (("avx2", "avx512"), {}, "float32", "no AMX or AVX512-BF16"),
        (AMX, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, "float32", "masked by ONEDNN_MAX_CPU_ISA=AVX2"),
        (AMX, {"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "float32", "ONEDNN_MAX_CPU_ISA=AVX512_CORE"),
        (AMX, {"ATEN_CPU_CAPABILITY": "avx2"}, "float32", "masked by ATEN_CPU_CAPABILITY=avx2"),
        (AMX, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "bfloat16", "natively"),
        (AMX, {"ONEDNN_MAX_CPU_ISA": "ALL"}, "bfloat16", "natively"),
    ],
)
def test_auto_on_the_cpu(monkeypatch, units, env, dtype, why) -> None:
    _cpu(monkeypatch, *units)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    p = precision.resolve("auto", "cpu")
    assert (p.dtype, p.requested, p.device) == (dtype, "auto", "cpu")
    assert why in p.reason and p.reason.startswith("auto: ")
    assert p.autocast == (torch.bfloat16 if dtype == "bfloat16" else None)
    assert precision.warning(p) is None  # auto never emulates


def test_explicit_dtypes_are_kept_and_float32_is_no_autocast(monkeypatch) -> None:
    _cpu(monkeypatch, *ZEN3)
    assert precision.resolve("float32", "cpu").autocast is None
    p = precision.resolve("bfloat16", "cpu")
    assert p.dtype == "bfloat16" and p.autocast is torch.bfloat16
    assert "as the spec asks; the CPU has no AMX" in p.reason


def test_an_emulated_dtype_is_warned_about_with_its_measured_cost(monkeypatch) -> None:
    _cpu(monkeypatch, *ZEN3)
    monkeypatch.setattr(precision, "emulation_cost", lambda dtype: 37.4)
    text = precision.warning(precision.resolve("bfloat16", "cpu"))
    assert text is not None
    assert "measured 37x slower than float32 here" in text and "dtype: auto" in text
    _cpu(monkeypatch, *AMX)
    assert precision.warning(precision.resolve("bfloat16", "cpu")) is None  # native: no cost
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # masked: emulated again
    assert "masked by ONEDNN_MAX_CPU_ISA=AVX2" in (
        precision.warning(precision.resolve("bfloat16", "cpu")) or ""
    )


def test_auto_on_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision.resolve("auto", "cuda").dtype == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    p = precision.resolve("auto", "cuda")
    assert p.dtype == "float32" and "no bfloat16" in p.reason  # no float16 without loss scaling
    assert precision.resolve("float16", "cuda").dtype == "float16"
    assert precision.warning(precision.resolve("bfloat16", "cuda")) is None


def test_the_trainers_autocast_follows_the_resolution(monkeypatch) -> None:
    model = torch.nn.Linear(2, 2)
    _cpu(monkeypatch, *ZEN3)
    assert comp.compute_autocast(_run().spec, model) is None
    assert comp.compute_autocast(_run(dtype="bfloat16").spec, model) is torch.bfloat16
    _cpu(monkeypatch, *AMX)
    assert comp.compute_autocast(_run().spec, model) is torch.bfloat16
    assert comp.compute_autocast(_run().spec, model.to(torch.bfloat16)) is None  # not mixed


def test_the_copying_curriculum_honours_the_dtype(monkeypatch) -> None:
    """It hard-coded bfloat16 autocast once, whatever the spec said: 37x slower on AVX2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    entered: list[torch.dtype] = []
    real = torch.autocast

    def spy(device_type, dtype=None, **kw):
        entered.append(dtype)
        return real(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(torch, "autocast", spy)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    copy_curriculum(LlamaForCausalLM(config), list(range(10, 40)), steps=1, autocast=None)
    assert entered == []
    copy_curriculum(LlamaForCausalLM(config), list(range(10, 40)), steps=1, autocast=torch.bfloat16)
    assert entered and set(entered) == {torch.bfloat16}
    _cpu(monkeypatch, *ZEN3)
    assert comp.curriculum_precision(_run().spec.model).autocast is None


def test_the_curriculums_micro_batches_give_the_one_batch_loss_and_gradient() -> None:
    """Rows sorted into micro-batches of similar length, logits at the targets only: the same
    token-mean loss and gradient as one batch padded to its longest with logits everywhere."""
    import random

    from transformers import LlamaConfig, LlamaForCausalLM

    from gagar.trainer.model.presets import COPY_MICRO, copy_loss_sum, copy_rows

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    model = LlamaForCausalLM(config)
    rows = copy_rows(random.Random(0), list(range(10, 40)))
    targets = sum(n - 1 for _, n in rows)
    width = max(len(r) for r, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (row, n) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, len(row) - n + 1 : len(row)] = True
    logits = model(ids).logits[:, :-1]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 64), ids[:, 1:].reshape(-1), reduction="none"
    )
    whole = (nll * mask[:, 1:].reshape(-1)).sum() / targets
    whole.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ordered = sorted(rows, key=lambda r: len(r[0]))
    size = -(-len(rows) // COPY_MICRO)
    total = 0.0
    for i in range(0, len(rows), size):
        loss = copy_loss_sum(model, ordered[i : i + size], None) / targets
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(float(whole), rel=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_the_log_and_the_summary_say_which_dtype_and_why(monkeypatch, caplog) -> None:
    _cpu(monkeypatch, *ZEN3)
    monkeypatch.setattr(precision, "emulation_cost", lambda dtype: 37.0)
    console = Console(record=True, width=200)
    with caplog.at_level(logging.WARNING, logger="gagar"):
        announce_precision(_run(), console)
    said = console.export_text()
    assert "compute dtype: float32 (auto: the CPU has no AMX or AVX512-BF16" in said
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="gagar"):
        announce_precision(_run(dtype="bfloat16"), Console(record=True))
    assert "37x slower" in caplog.text
    rows = dict(
        report.summary_rows(
            {
                "run": "r",
                "mode": "gagar",
                "policy_version": 0,
                "steps": 0,
                "precision": precision.resolve("auto", "cpu").as_dict(),
            },
            [],
        )
    )
    assert rows["compute dtype"].startswith("float32 (auto: the CPU has no AMX")


def test_the_warm_start_key_follows_the_resolved_dtype(monkeypatch) -> None:
    """``auto`` is one spec value and two warm starts: an AVX2 cache entry is not an AMX one."""
    _cpu(monkeypatch, *ZEN3)
    avx2 = sft.warm_start_key(_run())
    _cpu(monkeypatch, *AMX)
    amx = sft.warm_start_key(_run())
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert avx2 != amx and sft.warm_start_key(_run()) == avx2
