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


def _groups(*exits: str) -> list:
    from gagar.driver.rollouts import GroupResult, Rollout
    from gagar.rollout.agent import Trajectory

    rollouts = [
        Rollout(
            Trajectory([0], [0.0], [0], 1, [], exit_reason=e, exit_detail=f"{e}!"),
            False,
            e == "submitted",
        )
        for e in exits
    ]
    return [GroupResult(None, rollouts, [{} for _ in rollouts])]


def _ctx_with_server(tmp_path: Path, script: str):
    """A Context as ``check_engine`` sees it, whose engine server is a process running ``script``."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from gagar.rollout.engines.server import ServerConfig, VllmServer

    log = tmp_path / "vllm.log"
    log.write_text("EngineCore encountered an issue\n")
    server = VllmServer(ServerConfig(model=tmp_path), log)
    server.proc = subprocess.Popen([sys.executable, "-c", script])
    return SimpleNamespace(services=SimpleNamespace(engine_alive=server.check_alive)), server


def test_engine_that_died_during_evaluation_fails_it_with_vllms_exit(tmp_path: Path) -> None:
    from gagar.driver.loop import check_engine
    from gagar.rollout.engines.server import VllmServerError

    # the server answers errors first and exits a moment later, as vLLM does after EngineDeadError
    ctx, _ = _ctx_with_server(tmp_path, "import sys, time; time.sleep(1); sys.exit(3)")
    with pytest.raises(VllmServerError, match="vLLM exited with code 3") as err:
        check_engine(ctx, _groups("submitted", "engine_error"), strict=True)
    assert "EngineCore encountered an issue" in str(err.value)
    # in a training step too: the step fails before an update on what survived
    with pytest.raises(VllmServerError, match="code 3"):
        check_engine(ctx, _groups("engine_error"), strict=False)


def test_engine_errors_of_a_live_engine_fail_an_evaluation_but_not_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gagar.driver import loop

    monkeypatch.setattr(loop, "ENGINE_EXIT_WAIT_S", 0.5)
    ctx, server = _ctx_with_server(tmp_path, "import time; time.sleep(60)")
    try:
        loop.check_engine(ctx, _groups("submitted", "sandbox_error"), strict=True)
        loop.check_engine(ctx, _groups("submitted", "engine_error"), strict=False)
        with pytest.raises(loop.EngineLost, match=r"1 of 2 trajectories failed at the engine"):
            loop.check_engine(ctx, _groups("submitted", "engine_error"), strict=True)
    finally:
        server.proc.kill()
        server.proc.wait()


def test_failed_evaluation_says_so_and_how_to_repeat_it(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from gagar.driver.cli import _explain_failure
    from gagar.driver.loop import EngineLost

    console = Console(record=True, width=200)
    ckpt = SimpleNamespace(complete=lambda: [SimpleNamespace(step=3)])
    ctx = SimpleNamespace(services=SimpleNamespace(engine_alive=None), ckpt=ckpt, step=3)
    try:
        raise EngineLost("2 of 16 trajectories failed at the engine")
    except EngineLost as err:
        _explain_failure(ctx, tmp_path, console, err, evaluating=True)
    text = " ".join(console.export_text().split())
    assert "held-out evaluation failed: EngineLost: 2 of 16 trajectories" in text
    assert "newest complete checkpoint is of step 3" in text and "--eval-only" in text
    assert "step 4 failed" not in text
    assert (tmp_path / "logs" / "error.log").read_text().startswith("Traceback")


def _hostile_group():
    """A group whose second member left odd names, a link, a binary and a huge file behind."""
    from types import SimpleNamespace

    from gagar.driver.advantages import Rollout
    from gagar.driver.rollouts import GroupResult
    from gagar.grader.sample import BASE, CLEAN
    from gagar.rollout.agent import Trajectory

    task = SimpleNamespace(
        repo_files=lambda: {**BASE, "logo.png": b"\x89PNG\xff"},
        instance_id="t",
        problem_statement="fix mean",
        reference_files={"calc/ops.py": CLEAN},
        test_command="python -m pytest -q",
        environment=None,
        held_back=[],
    )
    hostile = {"..evil.py": "x = 1\n", "a\\b.py": "", "calc/../x.py": "", "\udcff.py": ""}
    finals = [BASE | {"calc/ops.py": CLEAN}, BASE | {"calc/ops.py": CLEAN} | hostile]
    rollouts = [
        Rollout(Trajectory([0], [0.0], [0], 1, [], exit_reason="submitted"), True, True)
        for _ in finals
    ]
    return GroupResult(task, rollouts, finals)


def test_names_the_safe_path_check_refuses_are_skipped_not_fatal_to_the_step(tmp_path) -> None:
    """The driver's grading call on a group whose member left names no repository may hold: the
    group is graded (both passes ranked) and every refused name is in the ranking's report."""
    from types import SimpleNamespace

    from gagar.driver.loop import _grade
    from gagar.grader.protocol import HeuristicGrader

    heuristic = HeuristicGrader()
    spec = SimpleNamespace(deadline_seconds=30, fallback="heuristic")
    ctx = SimpleNamespace(
        run=SimpleNamespace(spec=SimpleNamespace(grader=spec)),
        services=SimpleNamespace(grader=heuristic, fallback_grader=heuristic),
        step=0, version=0, out=tmp_path,
    )  # fmt: skip
    ranking = asyncio.run(_grade(ctx, _hostile_group()))
    assert ranking.fallback is None and ranking.check_complete([0, 1]) is None
    assert (tmp_path / "grading_episodes.jsonl").read_text().count("\n") == 1  # the episode kept
    refused = {(s.member, s.path, s.reason) for s in ranking.skipped}
    assert {(1, "..evil.py", "unsafe_path"), (1, "a\\b.py", "unsafe_path")} <= refused
    assert (1, "\\udcff.py", "unsafe_path") in refused
    assert (None, "logo.png", "not_text") in refused


def test_final_files_are_read_within_bounds_and_links_do_not_raise() -> None:
    from gagar.driver.rollouts import _text_files
    from gagar.grader.bounds import BOUNDS, MARKER_PREFIX

    class Session:
        def __init__(self) -> None:
            self.read: list[str] = []

        def list_files(self) -> list[str]:
            return ["a.py", "link", "huge.py", "../up.py", "blob.bin"]

        def read_file(self, path: str) -> bytes:
            self.read.append(path)
            if path == "link":
                raise OSError("cannot read link: Too many levels of symbolic links")
            if path == "huge.py":
                return b"x" * (BOUNDS.file_bytes + 1)
            return b"\xff\xfe" if path == "blob.bin" else b"x = 1\n"

    session = Session()
    files, skipped = _text_files(session, {"a.py"})
    assert files["a.py"] == "x = 1\n" and files["huge.py"].startswith(MARKER_PREFIX)
    assert {s.path: s.reason for s in skipped} == {
        "link": "unreadable",
        "huge.py": "file_too_large",
        "../up.py": "unsafe_path",
        "blob.bin": "not_text",
    }
    assert "../up.py" not in session.read  # a refused name is never read
