"""A checkpoint saved at one parallel layout resumes at another (two CPU processes, gloo).

Per model (dense Qwen2 with tied embeddings at TP=2, Qwen3-MoE at EP=2) one two-process job (spawned once: starting
Megatron costs seconds per process) runs, from the same HF weights:

- at the saved layout: a step, a checkpoint, the next step (the uninterrupted run);
- at TP=1, DP=2 (each rank a whole replica): the same, then a fresh policy restored from the
  first layout's checkpoint takes the next step, and exports that checkpoint to HF;
- at the first layout again: a fresh policy restored from the TP=1, DP=2 checkpoint takes the next
  step and exports it.

The resumed step's loss and weights must match the uninterrupted run's (the update at another
layout differs only by summation order), and every export must equal the saved weights exactly.
The dense model trains with a KL term against a reference that is not the start policy (frozen
after the first step, as after a warm start), so a restore that lost the reference would change
the loss. A checkpoint of the older per-rank format loads at its own layout and is refused at
another with one line saying how to convert it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.random_models import save_random_hf_model

WORLD, VOCAB = 2, 256
# name -> (family, the layout saved first, KL against a reference)
CASES = {"dense-tp2": ("qwen2", {"tp": 2}, True), "moe-ep2": ("qwen3_moe", {"ep": 2}, False)}
DP2: dict[str, int] = {}  # TP=1, EP=1: both ranks are data-parallel replicas


def _batch(seed: int) -> list[Any]:
    from gagar.trainer.learner import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        length = 8 + i % 3
        ids = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        adv = [1.0 if i % 2 else -0.5] * length
        out.append(Sample(ids, [0, 0] + [1] * (length - 2), [-3.0] * length, adv, group=i // 2))
    return out


def _rank_state(hf: str, ckpt: Path, kl: bool) -> Any:
    """A trainer rank as ``gagar.driver.setup`` builds it, on the initialized layout."""
    from gagar.driver.setup import frozen_reference, load_policy
    from gagar.trainer.checkpoint import CheckpointManager
    from gagar.trainer.distributed import RankState, megatron_data_parallel
    from gagar.trainer.learner import Learner, LearnerConfig
    from gagar.trainer.loss import LossConfig
    from gagar.trainer.model.parallel import current_parallel
    from gagar.trainer.policy import MegatronPolicy

    p = current_parallel()
    model = load_policy(Path(hf))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.01)
    cfg = LearnerConfig(
        micro_batch_size=1, grad_clip=1.0, loss=LossConfig(kl_coef=0.5 if kl else 0)
    )
    ref = MegatronPolicy(frozen_reference(Path(hf)), p.tp) if kl else None
    learner = Learner(MegatronPolicy(model, p.tp), opt, cfg, megatron_data_parallel(), ref)
    learner.reset_reference()
    return RankState(model, learner, CheckpointManager(ckpt), {"tp": p.tp, "ep": p.ep, "pp": p.pp})


def _weights(rank: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in rank.weights()}  # gathered on global rank 0


def _legacy_save(rank: Any, root: Path, step: int) -> None:
    """The per-rank checkpoint format of earlier releases (one model/optimizer/rng part per rank)."""
    import torch.distributed as dist

    from gagar.trainer.checkpoint import CheckpointManager

    ckpt = CheckpointManager(root)
    staging = ckpt.staging_path(step, "job")
    if dist.get_rank() == 0:
        ckpt.stage(step, "job")
    dist.barrier()
    files = ckpt.write_parts(staging, rank._parts())
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, files)
    if dist.get_rank() == 0:
        merged = {n: m for part in gathered for n, m in part.items()}
        layout = {"world_size": WORLD, **rank.layout}
        ckpt.commit(step, staging, merged, {"policy_version": step, "layout": layout})
    dist.barrier()


def _train_and_save(hf: str, tmp: Path, name: str, kl: bool, out: dict) -> Any:
    """The uninterrupted run at the current layout, saving after its first step."""
    rank = _rank_state(hf, tmp / name, kl)
    rank.update(_batch(1), 0)
    rank.learner.reset_reference()  # the reference is now not the start policy
    start = time.perf_counter()
    rank.save(1, {"policy_version": 1})
    out[(name, "save_s")] = time.perf_counter() - start
    out[(name, "saved")] = _weights(rank)
    metrics = rank.update(_batch(2), 1)
    out[(name, "next")] = {"loss": metrics["loss"], "weights": _weights(rank)}
    return rank


def _resume(hf: str, tmp: Path, src: str, kl: bool, out: dict, label: str) -> None:
    """A fresh policy restored from ``src``'s checkpoint: its next step and an HF export."""
    from gagar.trainer import sharded

    rank = _rank_state(hf, tmp / src, kl)
    start = time.perf_counter()
    state = rank.restore(1)
    out[(label, "load_s")] = time.perf_counter() - start
    out[(label, "state")] = state
    sharded.export_hf(tmp / src / "step_00000001", Path(hf), tmp / f"export-{label}")
    metrics = rank.update(_batch(2), 1)
    out[(label, "next")] = {"loss": metrics["loss"], "weights": _weights(rank)}


def _legacy_restore(hf: str, tmp: Path, out: dict, label: str) -> None:
    from gagar.trainer.distributed import LayoutMismatch

    rank = _rank_state(hf, tmp / "legacy", kl=False)
    try:
        rank.restore(1)
        out[(label, "legacy")] = _weights(rank)
    except LayoutMismatch as err:
        out[(label, "legacy")] = str(err)


def _worker(rank_id: int, tmp_dir: str, hf_dirs: dict[str, str]) -> None:
    import warnings

    import torch.distributed as dist

    from gagar.trainer.model import Parallel, destroy_distributed, init_distributed

    warnings.filterwarnings("ignore")
    tmp, out, t0 = Path(tmp_dir), {}, time.perf_counter()
    for case, (_, first, kl) in CASES.items():
        hf, base, got = hf_dirs[case], tmp / case, out.setdefault(case, {})
        for phase, layout in enumerate((first, DP2, first)):
            init_distributed(Parallel(**layout), rank_id, WORLD, init_method=f"file://{tmp}/rdzv")
            if phase == 0:
                rank = _train_and_save(hf, base, "first", kl, got)
                if case == "dense-tp2":
                    _legacy_save(
                        rank, base / "legacy", 1
                    )  # of the uninterrupted run after its next step
            elif phase == 1:
                _train_and_save(hf, base, "dp2", kl, got)
                _resume(hf, base, "first", kl, got, "first->dp2")
                if case == "dense-tp2":
                    _legacy_restore(hf, base, got, "legacy@dp2")
            else:
                _resume(hf, base, "dp2", kl, got, "dp2->first")
                if case == "dense-tp2":
                    _legacy_restore(hf, base, got, "legacy@first")
            destroy_distributed(keep_process_group=True)
            print(
                f"rank {rank_id} {case} phase {phase}: {time.perf_counter() - t0:.1f}s", flush=True
            )
    if rank_id == 0:
        torch.save(out, tmp / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("reshard")
    hf_dirs = {}
    for case, (family, _, _) in CASES.items():
        hf_dirs[case] = str(tmp / f"hf-{case}")
        tied = case == "dense-tp2"  # as the presets (tiny, SmolLM2) are
        save_random_hf_model(family, hf_dirs[case], vocab_size=VOCAB, tie_word_embeddings=tied)
    start = time.perf_counter()
    mp.spawn(_worker, args=(str(tmp), hf_dirs), nprocs=WORLD, join=True)
    print(f"\n2-process job {time.perf_counter() - start:.1f}s")
    return {"tmp": tmp, "out": torch.load(tmp / "result.pt", weights_only=False)}


def _assert_close(got: dict, want: dict, what: str) -> None:
    assert abs(got["loss"] - want["loss"]) <= 1e-5 * max(1.0, abs(want["loss"])), what
    assert set(got["weights"]) == set(want["weights"]), what
    for name, w in want["weights"].items():
        diff = (got["weights"][name] - w).abs().max().item()
        assert diff <= 2e-5, (what, name, diff)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    ("resumed", "uninterrupted"), [("first->dp2", "first"), ("dp2->first", "dp2")]
)
def test_resume_at_another_layout_takes_the_uninterrupted_step(
    runs: dict, case: str, resumed: str, uninterrupted: str
) -> None:
    out = runs["out"][case]
    _assert_close(out[(resumed, "next")], out[(uninterrupted, "next")], f"{case} {resumed}")
    # Not vacuous: the step moved the weights away from the checkpoint's.
    saved, after = out[(uninterrupted, "saved")], out[(uninterrupted, "next")]["weights"]
    assert max((after[n] - saved[n]).abs().max().item() for n in saved) > 1e-4
    assert out[(resumed, "state")]["policy_version"] == 1


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("export", "saved"), [("first->dp2", "first"), ("dp2->first", "dp2")])
def test_checkpoint_exports_to_hf_from_any_layout(
    runs: dict, case: str, export: str, saved: str
) -> None:
    from safetensors.torch import load_file

    got = load_file(runs["tmp"] / case / f"export-{export}" / "model.safetensors")
    want = runs["out"][case][(saved, "saved")]
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want), case


def test_checkpoint_is_sharded_and_in_the_manifest(runs: dict) -> None:
    import json

    step = runs["tmp"] / "moe-ep2" / "first" / "step_00000001"
    files = json.loads((step / "COMPLETE").read_text())["files"]
    assert {
        "metadata.json",
        "common.pt",
        ".metadata",
        "rng-rank00000.pt",
        "rng-rank00001.pt",
    } <= set(files)
    assert any(name.endswith(".distcp") for name in files)
    assert not any(name.startswith(("model", "optimizer")) for name in files)
    assert sorted(files) == sorted(p.name for p in step.iterdir() if p.name != "COMPLETE")
    state = json.loads((step / "state.json").read_text())
    assert state["format"] == "megatron-dist"
    assert state["layout"] == {"world_size": 2, "tp": 1, "ep": 2, "pp": 1}


def test_old_per_rank_checkpoint_loads_at_its_layout_and_names_the_way_elsewhere(
    runs: dict,
) -> None:
    out = runs["out"]["dense-tp2"]
    refused = out[("legacy@dp2", "legacy")]
    assert isinstance(refused, str) and "\n" not in refused
    assert "per-rank checkpoint" in refused and "resume it once at its own layout" in refused
    loaded = out[("legacy@first", "legacy")]
    assert isinstance(loaded, dict)
    want = out[("first", "next")]["weights"]  # the legacy parts are of the run after its next step
    assert set(loaded) == set(want)
    assert all(torch.equal(loaded[n], want[n]) for n in want)


def test_cli_exports_a_tp2_checkpoint_in_one_process(runs: dict, tmp_path: Path) -> None:
    import subprocess
    import sys

    from safetensors.torch import load_file

    case = runs["tmp"] / "dense-tp2"

    def export(step_dir: Path, out: Path) -> subprocess.CompletedProcess:
        cmd = ["model", "export-checkpoint", "--from", str(step_dir), "--to-hf", str(out)]
        cmd += ["--policy", str(runs["tmp"] / "hf-dense-tp2")]
        return subprocess.run(
            [sys.executable, "-m", "gagar.cli", *cmd], capture_output=True, text=True
        )

    done = export(case / "first" / "step_00000001", tmp_path / "hf")
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        runs["out"]["dense-tp2"][("first", "saved")],
    )
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert (tmp_path / "hf" / "config.json").is_file()
    refused = export(case / "legacy" / "step_00000001", tmp_path / "no")
    assert refused.returncode == 2 and "per-rank checkpoint" in refused.stderr
    assert not (tmp_path / "no").exists()
