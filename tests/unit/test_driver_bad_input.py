"""`gagar train` refuses what it cannot run with one clear line, before anything is written, and a
grader that hangs or crashes falls back as configured instead of stopping training."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from gagar.cli import main
from gagar.driver.sampling import grade_with_deadline
from gagar.wire import Ranking

ROOT = Path(__file__).resolve().parents[2]


def _manifest(tmp_path: Path, **spec_changes) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    for path, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = path.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    out = tmp_path / "run.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"trainer__device": "cuda"}, "spec.trainer.device is 'cuda' but this machine has no CUDA"),
        ({"rollout__device": "cuda"}, "spec.rollout.device is 'cuda' but this machine has no CUDA"),
        (
            {"dataset__sources": [{"kind": "jsonl", "path": "/nonexistent/tasks.jsonl"}]},
            "spec.dataset.sources[0].path '/nonexistent/tasks.jsonl' does not exist",
        ),
        ({"sandbox__backend": "pods"}, "spec.sandbox.backend 'pods' needs the cluster"),
    ],
)
def test_unrunnable_spec_is_a_clear_error_and_writes_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, message: str
) -> None:
    import torch

    if torch.cuda.is_available() and "cuda" in message:
        pytest.skip("this machine has a GPU")
    out = tmp_path / "out"
    assert main(["train", str(_manifest(tmp_path, **changes)), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot start" in err and message in err
    assert not any(out.rglob("*")), "nothing is written for a run that cannot start"


def test_invalid_manifest_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _manifest(tmp_path, algorithm__groupSize=1)
    assert main(["train", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "invalid GagarRun" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


RANKING = Ranking(grader="agentic", fallback=None)


async def _fallback(group, reason: str) -> Ranking:
    short = "timeout" if reason == "timeout" else "grader_error"
    return Ranking(grader="heuristic", fallback=short, detail=reason)


def test_grader_past_its_deadline_falls_back_with_the_reason() -> None:
    async def slow(group) -> Ranking:
        await asyncio.sleep(10)
        return RANKING

    ranking = asyncio.run(grade_with_deadline(slow, None, 0.05, _fallback))
    assert (ranking.grader, ranking.fallback) == ("heuristic", "timeout")


def test_grader_crash_falls_back_with_the_error() -> None:
    async def broken(group) -> Ranking:
        raise ConnectionError("grader pool unreachable")

    ranking = asyncio.run(grade_with_deadline(broken, None, 5, _fallback))
    assert ranking.fallback == "grader_error"
    assert ranking.detail == "grader_error: ConnectionError: grader pool unreachable"


def test_grader_in_time_is_used() -> None:
    async def quick(group) -> Ranking:
        return RANKING

    assert asyncio.run(grade_with_deadline(quick, None, 5, _fallback)) is RANKING
