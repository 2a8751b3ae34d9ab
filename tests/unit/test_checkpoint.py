"""Checkpoints are atomic: a SIGKILL at any moment leaves the previous or the new one, verified."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from gagar.trainer.checkpoint import CheckpointError, CheckpointManager, truncate_jsonl


def test_save_load_roundtrip_and_prune(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        mgr.save(step, {"model": {"w": torch.full((3,), float(step))}}, {"policy_version": step})
    assert [c.step for c in mgr.complete()] == [2, 3]
    latest = mgr.latest()
    assert latest is not None and latest.step == 3
    assert torch.equal(latest.load("model")["w"], torch.full((3,), 3.0))
    assert latest.state() == {"policy_version": 3, "step": 3}
    with pytest.raises(CheckpointError, match="no part"):
        latest.load("optimizer")


def test_corrupt_and_incomplete_checkpoints_are_skipped(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=5)
    mgr.save(1, {"model": {"w": torch.ones(4)}}, {})
    newest = mgr.save(2, {"model": {"w": torch.zeros(4)}}, {})
    data = bytearray((newest.path / "model.pt").read_bytes())
    data[-5] ^= 0xFF
    (newest.path / "model.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        mgr.verify(newest.path)
    (tmp_path / "step_00000009.tmp-123").mkdir()  # a kill mid-write
    latest = mgr.latest()
    assert latest is not None and latest.step == 1


def test_truncate_jsonl_drops_later_steps_and_torn_lines(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps({"step": s}) for s in range(1, 6)) + '\n{"step": 6, "lo')
    assert truncate_jsonl(log, 3) == 3
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3]


WRITER = textwrap.dedent(
    """
    import sys, torch
    from gagar.trainer.checkpoint import CheckpointManager
    mgr = CheckpointManager(sys.argv[1], keep=2)
    step = 0
    while True:
        step += 1
        mgr.save(step, {"model": {"w": torch.full((256, 1024), float(step))}}, {"step_value": step})
        print(step, flush=True)
    """
)


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45, 0.8])
def test_sigkill_at_any_moment_leaves_a_verified_checkpoint(tmp_path: Path, delay: float) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # at least one checkpoint completed
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    mgr = CheckpointManager(tmp_path, keep=2)
    latest = mgr.latest()
    assert latest is not None and latest.step >= int(first)
    mgr.verify(latest.path)
    w = latest.load("model")["w"]
    assert torch.all(w == float(latest.step)), "the checkpoint holds exactly the state of its step"
    # the next save after a kill cleans leftovers and continues
    mgr.save(latest.step + 1, {"model": {"w": torch.zeros(1)}}, {})
    assert not list(tmp_path.glob("*.tmp-*"))
