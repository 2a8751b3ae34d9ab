"""HF <-> Megatron conversion, checked by logits against transformers and by exact round trips.

Runs in this process as a one-rank gloo job (TP=1); the sharded folders are written for TP=2
and EP=2 and re-sharded on load, so the disk format is exercised at other layouts too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gagar.cli import main
from gagar.trainer.model import (
    CheckpointError,
    Parallel,
    build_model,
    convert_hf_to_megatron,
    export_megatron_to_hf,
    init_distributed,
    iter_hf_weights,
    load_hf_into_megatron,
    load_megatron_checkpoint,
    read_config,
)
from tests.support.random_models import save_random_hf_model

FAMILIES = ["llama", "llama-tied", "qwen2", "qwen3", "qwen3_moe"]
SEQ = 16


@pytest.fixture(scope="module", autouse=True)
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> None:
    rdzv = tmp_path_factory.mktemp("rdzv") / "file"
    init_distributed(Parallel(), rank=0, world_size=1, init_method=f"file://{rdzv}")


def _ids(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(3))
    return ids, torch.arange(SEQ).expand(2, SEQ)


def _max_logit_diff(hf_model, megatron_model) -> float:  # type: ignore[no-untyped-def]
    ids, pos = _ids(hf_model.config.vocab_size)
    with torch.no_grad():
        return (hf_model(ids).logits - megatron_model(ids, pos, None)).abs().max().item()


@pytest.mark.parametrize("family", [*FAMILIES, "qwen3_moe-unnormalized"])
def test_converted_model_gives_transformers_logits(tmp_path: Path, family: str) -> None:
    extra = {"norm_topk_prob": False} if family.endswith("unnormalized") else {}
    hf = save_random_hf_model(family.split("-unn")[0], tmp_path, **extra)
    model = build_model(read_config(tmp_path))
    load_hf_into_megatron(model, tmp_path)
    assert _max_logit_diff(hf, model) <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_folder_round_trip_is_exact(tmp_path: Path, family: str) -> None:
    hf = save_random_hf_model(family, tmp_path / "hf")
    ep = 2 if family == "qwen3_moe" else 1
    meta = convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", tp=2, ep=ep)
    assert len(list((tmp_path / "mg").glob("tp*_ep*.safetensors"))) == 2 * ep == meta.tp * meta.ep
    export_megatron_to_hf(tmp_path / "mg", tmp_path / "back")
    want, got = (
        load_file(tmp_path / "hf/model.safetensors"),
        load_file(tmp_path / "back/model.safetensors"),
    )
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert read_config(tmp_path / "back") == read_config(tmp_path / "hf")
    # The TP=2 folder re-shards into this TP=1 model and still computes transformers' logits.
    model = build_model(read_config(tmp_path / "mg"))
    load_megatron_checkpoint(model, tmp_path / "mg")
    assert _max_logit_diff(hf, model) <= 1e-4
    gathered = dict(iter_hf_weights(model))
    assert all(torch.equal(gathered[n], want[n]) for n in want)


def test_cli_convert_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_random_hf_model("qwen2", tmp_path / "hf")
    assert (
        main(
            [
                "model",
                "convert",
                "--from-hf",
                str(tmp_path / "hf"),
                "--to",
                str(tmp_path / "mg"),
                "--tp",
                "2",
            ]
        )
        == 0
    )
    assert (
        main(["model", "export", "--from", str(tmp_path / "mg"), "--to-hf", str(tmp_path / "out")])
        == 0
    )
    assert json.loads((tmp_path / "mg/megatron.json").read_text())["tp"] == 2
    assert (tmp_path / "out/model.safetensors").is_file() and (
        tmp_path / "out/config.json"
    ).is_file()
    assert (
        main(["model", "export", "--from", str(tmp_path / "hf"), "--to-hf", str(tmp_path / "x")])
        == 2
    )
    assert "megatron.json is missing" in capsys.readouterr().err


# ------------------------------------------------------------------- corrupt or mismatched


def _edit_weights(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def _edit_config(folder: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


NAME = "model.layers.1.self_attn.k_proj.weight"


@pytest.mark.parametrize(
    ("family", "corrupt", "message"),
    [
        ("llama", lambda d: _edit_weights(d, lambda t: t.pop(NAME)), f"{NAME}' is missing"),
        (
            "llama",
            lambda d: _edit_weights(d, lambda t: t.update({NAME: t[NAME][:-1]})),
            rf"{NAME}' has shape \(31, 64\), expected \(32, 64\)",
        ),
        (
            "qwen2",
            lambda d: _edit_config(d, model_type="llama"),
            r"_proj.bias' does not belong to a llama",
        ),
        ("llama", lambda d: _edit_config(d, model_type="qwen3"), r"q_norm.weight' is missing"),
        (
            "llama",
            lambda d: _edit_config(d, num_hidden_layers=3),
            r"model.layers.2.input_layernorm.weight' is missing",
        ),
        ("llama", lambda d: _edit_config(d, model_type="gpt2"), "model_type='gpt2'"),
        (
            "llama",
            lambda d: (d / "model.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()[:100]
            ),
            "unreadable safetensors",
        ),
    ],
    ids=[
        "missing",
        "shape",
        "family-extra",
        "family-missing",
        "layers",
        "unsupported",
        "truncated",
    ],
)
def test_bad_hf_checkpoints_name_the_problem(
    tmp_path: Path, family: str, corrupt, message: str
) -> None:  # type: ignore[no-untyped-def]
    save_random_hf_model(family, tmp_path / "hf")
    corrupt(tmp_path / "hf")
    with pytest.raises(ValueError, match=message):
        convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", tp=2)


def test_live_load_refuses_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    save_random_hf_model("llama", tmp_path / "a")
    save_random_hf_model("llama", tmp_path / "b", hidden_size=32)
    model = build_model(read_config(tmp_path / "a"))
    with pytest.raises(CheckpointError, match=r"config.json describes"):
        load_hf_into_megatron(model, tmp_path / "b")


def test_bad_megatron_folders_name_the_problem(tmp_path: Path) -> None:
    save_random_hf_model("llama", tmp_path / "hf")
    convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", tp=2)
    (tmp_path / "mg/tp01_ep00.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"shard file tp01_ep00.safetensors is missing"):
        export_megatron_to_hf(tmp_path / "mg", tmp_path / "out")
    convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", tp=2)
    shard = load_file(tmp_path / "mg/tp01_ep00.safetensors")
    shard.pop("decoder.layers.0.mlp.linear_fc2.weight")
    save_file(shard, tmp_path / "mg/tp01_ep00.safetensors")
    with pytest.raises(
        CheckpointError, match=r"linear_fc2.weight' is missing from tensor-parallel rank 1"
    ):
        export_megatron_to_hf(tmp_path / "mg", tmp_path / "out")


def test_indivisible_layouts_are_refused(tmp_path: Path) -> None:
    save_random_hf_model("llama", tmp_path / "hf")
    with pytest.raises(ValueError, match="ep=2 needs a MoE model"):
        convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", ep=2)
    with pytest.raises(
        ValueError, match="num_key_value_heads=2 is not divisible by parallel size 4"
    ):
        convert_hf_to_megatron(tmp_path / "hf", tmp_path / "mg", tp=4)
    save_random_hf_model("llama", tmp_path / "hf3", num_key_value_heads=4, vocab_size=255)
    with pytest.raises(ValueError, match="vocab_size=255 is not divisible by parallel size 2"):
        convert_hf_to_megatron(tmp_path / "hf3", tmp_path / "mg", tp=2)
