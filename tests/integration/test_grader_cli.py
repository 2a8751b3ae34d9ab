"""``gagar grader sample``, ``gagar grade`` (in process, agentic, via a service) and ``gagar grader serve``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import httpx

from gagar.cli import main
from gagar.grader.sample import sample_group
from tests.support.fake_openai import FakeOpenAI, tool_call


def test_sample_then_grade_a_workspace(tmp_path, capsys):
    assert main(["grader", "sample", str(tmp_path / "ws")]) == 0
    capsys.readouterr()
    assert main(["grade", str(tmp_path / "ws")]) == 0
    ranking = json.loads(capsys.readouterr().out)
    assert ranking["grader"] == "heuristic"
    assert [g["members"] for g in ranking["tied_groups"]] == [[0], [1]]
    assert [h["member"] for h in ranking["hacks"]] == [2]


def test_grade_a_json_file_and_bad_input(tmp_path, capsys):
    path = tmp_path / "group.json"
    path.write_text(sample_group().model_dump_json())
    assert main(["grade", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["tied_groups"][0]["members"] == [0]
    path.write_text('{"task_id": "x"}')
    assert main(["grade", str(path)]) == 2
    assert "candidates" in capsys.readouterr().err


def test_grade_with_the_agentic_grader(tmp_path, capsys):
    submit = {
        "cand_1": {"place": 1, "tier": "T1", "reason": "minimal"},
        "cand_0": {"place": 2, "tier": "T2", "reason": "noisier"},
        "cand_2": {"place": 3, "tier": "hack", "reason": "edits the test"},
    }
    path = tmp_path / "group.json"
    path.write_text(sample_group().model_dump_json())
    with FakeOpenAI(
        [tool_call("diff", {"a": "base", "b": "cand_1"}), tool_call("submit_ranking", submit)]
    ) as fake:
        rc = main(
            [
                "grade",
                str(path),
                "--grader",
                "agentic",
                "--model-url",
                fake.base_url,
                "--model",
                "m",
                "--sandbox",
                "unsafe-local",
            ]
        )
    out = capsys.readouterr()
    assert rc == 0 and "WITHOUT isolation" in out.err
    ranking = json.loads(out.out)
    assert ranking["grader"] == "agentic" and ranking["tied_groups"][0]["members"] == [1]
    assert ranking["usage"]["prompt_tokens"] == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_grade_via_url_and_sigterm(tmp_path, capsys):
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "gagar.cli",
        "grader",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--drain-seconds",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        path = tmp_path / "group.json"
        path.write_text(sample_group().model_dump_json())
        assert main(["grade", str(path), "--url", url]) == 0
        assert json.loads(capsys.readouterr().out)["hacks"][0]["member"] == 2
        assert "gagar_grader_requests_total" in httpx.get(f"{url}/metrics").text
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, proc.stderr.read().decode()
