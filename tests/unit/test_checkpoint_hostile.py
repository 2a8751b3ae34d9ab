"""Checkpoints cannot run code, and a malformed one is skipped for the previous."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gagar.driver.setup import resume
from gagar.trainer.checkpoint import MANIFEST, Checkpoint, CheckpointError, CheckpointManager


class _Payload:
    """Pickles as "call os.system(...)": what a planted checkpoint would do on a weights_only=False load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_part_that_would_run_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    mgr = CheckpointManager(tmp_path / "ckpt")
    ckpt = mgr.save(1, {"model": {"w": torch.ones(2), "x": _Payload(marker)}}, {})
    mgr.verify(ckpt.path)  # self-consistent: the manifest's checksums match
    with pytest.raises(CheckpointError, match=r"model\.pt: cannot load"):
        ckpt.load("model")
    assert not marker.exists()


def test_optimizer_and_rng_parts_load_without_pickled_code(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    parts = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": torch.get_rng_state(),
    }
    ckpt = CheckpointManager(tmp_path).save(1, parts, {})
    opt.load_state_dict(ckpt.load("optimizer"))
    torch.set_rng_state(ckpt.load("rng"))
    assert torch.equal(ckpt.load("model")["weight"], model.state_dict()["weight"])


@pytest.mark.parametrize(
    "manifest",
    [
        "[]",
        '{"files": []}',
        '{"files": {"model.pt": 5}}',
        '{"files": {"model.pt": {"size": "x", "sha256": 1}}}',
        '{"files": {"../../etc/passwd": {"size": 1, "sha256": "0"}}}',
        '{"step": 2}',
        "not json",
    ],
)
def test_malformed_manifest_is_skipped_for_the_previous(
    tmp_path: Path, capsys, manifest: str
) -> None:
    mgr = CheckpointManager(tmp_path, keep=5)
    mgr.save(1, {"model": {"w": torch.ones(1)}}, {})
    bad = mgr.save(2, {"model": {"w": torch.zeros(1)}}, {})
    (bad.path / MANIFEST).write_text(manifest)
    latest = mgr.latest()
    assert latest is not None and latest.step == 1
    assert f"skipping checkpoint: {bad.path}" in capsys.readouterr().err


def _rank(root: Path, mgr: CheckpointManager) -> SimpleNamespace:
    """A trainer rank whose team's ``call("restore", step)`` loads parts as the trainer does."""

    def call(name: str, step: int):
        assert name == "restore"
        ckpt = Checkpoint(step, mgr.root / f"step_{step:08d}")
        model = ckpt.load("model")
        if model["w"].shape != (2,):
            raise RuntimeError("size mismatch for w")  # what load_state_dict raises
        return ckpt.state()

    return SimpleNamespace(ckpt=mgr, team=SimpleNamespace(call=call), out=root)


SAMPLER = SimpleNamespace(load_state=lambda state: None)


def test_resume_falls_back_past_checkpoints_that_do_not_load(tmp_path: Path, capsys) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt", keep=5)
    mgr.save(1, {"model": {"w": torch.ones(2)}}, {"policy_version": 1, "sampler": {}})
    mgr.save(
        2, {"model": {"w": torch.ones(3)}}, {"policy_version": 2, "sampler": {}}
    )  # wrong shape
    mgr.save(3, {"model": {"w": _Payload(tmp_path / "x")}}, {"policy_version": 3, "sampler": {}})
    assert resume(_rank(tmp_path, mgr), SAMPLER) == (1, 1)
    err = capsys.readouterr().err
    assert "step_00000003" in err and "step_00000002" in err and "size mismatch" in err


def test_resume_refuses_to_start_over_when_no_checkpoint_loads(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt")
    mgr.save(1, {"model": {"w": torch.ones(5)}}, {"policy_version": 1, "sampler": {}})
    with pytest.raises(CheckpointError, match="no checkpoint loads"):
        resume(_rank(tmp_path, mgr), SAMPLER)
    assert json.loads((mgr.root / "step_00000001" / MANIFEST).read_text())["step"] == 1


def _plant(path: Path, name: str, data: bytes) -> None:
    """Replace ``name`` in the checkpoint at ``path`` and record it in the manifest: the
    checksums match, only the content is wrong."""
    import hashlib

    (path / name).write_bytes(data)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "state",
    [
        "[]",
        '"state"',
        '{"step": 2, "policy_version": NaN, "sampler": {}}',
        '{"step": 2, "policy_version": Infinity, "sampler": {}}',
        '{"step": 2, "policy_version": 1e400, "sampler": {}}',
        '{"step": 2, "policy_version": -1, "sampler": {}}',
        '{"step": 2, "policy_version": 2.5, "sampler": {}}',
        '{"step": 2, "policy_version": true, "sampler": {}}',
        '{"step": 2, "policy_version": "2", "sampler": {}}',
        '{"step": 2, "policy_version": 2, "sampler": []}',
        '{"step": 2, "policy_version": 2, "sampler": {"pos": -3}}',
        '{"step": 2, "policy_version": 2, "sampler": {}, "layout": []}',
        '{"step": 7, "policy_version": 2, "sampler": {}}',
        '{"policy_version": 2, "sampler": {}}',
        '{"step": 2, "policy_version": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
    ids=[
        "list",
        "string",
        "nan",
        "infinity",
        "1e400",
        "negative",
        "fraction",
        "bool",
        "text",
        "sampler-list",
        "sampler-negative",
        "layout-list",
        "other-step",
        "no-step",
        "deep",
    ],
)
def test_a_malformed_state_json_is_skipped_for_the_previous(
    tmp_path: Path, capsys, state: str
) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt", keep=5)
    mgr.save(1, {"model": {"w": torch.ones(2)}}, {"policy_version": 1, "sampler": {}})
    bad = mgr.save(2, {"model": {"w": torch.ones(2)}}, {"policy_version": 2, "sampler": {}})
    _plant(bad.path, "state.json", state.encode())
    mgr.verify(bad.path)  # the checksums match: only the shape is wrong
    assert resume(_rank(tmp_path, mgr), SAMPLER) == (1, 1)
    assert f"skipping checkpoint: {bad.path / 'state.json'}" in capsys.readouterr().err


def test_a_part_with_non_finite_weights_is_skipped_for_the_previous(tmp_path: Path, capsys) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt", keep=5)
    mgr.save(1, {"model": {"w": torch.ones(2)}}, {"policy_version": 1, "sampler": {}})
    nan = torch.tensor([1.0, float("nan")])
    bad = mgr.save(2, {"model": {"w": nan}}, {"policy_version": 2, "sampler": {}})
    assert resume(_rank(tmp_path, mgr), SAMPLER) == (1, 1)
    err = capsys.readouterr().err
    assert f"{bad.path / 'model.pt'}: holds a tensor that is not finite" in err


def test_a_sampler_position_past_the_dataset_is_skipped_for_the_previous(
    tmp_path: Path, capsys
) -> None:
    from gagar.driver.sampling import TaskSampler

    sampler = TaskSampler(["a", "b", "c"], seed=0)  # type: ignore[list-item]
    mgr = CheckpointManager(tmp_path / "ckpt", keep=5)
    good = {"epoch": 1, "pos": 2}
    mgr.save(1, {"model": {"w": torch.ones(2)}}, {"policy_version": 1, "sampler": good})
    far = {"epoch": 0, "pos": 10**6}
    mgr.save(2, {"model": {"w": torch.ones(2)}}, {"policy_version": 2, "sampler": far})
    assert resume(_rank(tmp_path, mgr), sampler) == (1, 1)
    assert "step_00000002" in capsys.readouterr().err
    assert [i for i, _ in sampler.draw(2)] == [5, 6]  # epoch 1, position 2 of 3: resumed there
