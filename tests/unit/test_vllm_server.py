"""VllmServer's process handling with stand-in interpreters (fast; real vLLM is in integration)."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest

from gagar.cli import main
from gagar.rollout.engines.server import (
    ServerConfig,
    VllmServer,
    VllmServerError,
    server_command,
    server_env,
)

# Stands in for `python -m vllm.entrypoints.openai.api_server ...`: answers /health on --port,
# and spawns a child (like vLLM's engine core) that must die with it.
HEALTHY = f"""#!{sys.executable}
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
subprocess.Popen([{sys.executable!r}, "-c", "import time; time.sleep(600)"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""
DIES = "#!/bin/sh\necho 'ValueError: unsupported head size 80' >&2\nexit 3\n"
HANGS = "#!/bin/sh\nsleep 600\n"


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    return tmp_path / "model"


def test_ready_server_answers_and_stop_ends_its_process_group(tmp_path, model):
    server = VllmServer(
        ServerConfig(model=model), tmp_path / "log", python=script(tmp_path, HEALTHY)
    )
    with server:
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert server.startup_seconds is not None
        pgid = server.proc.pid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _live_members(pgid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"processes of the server's group survived stop(): {_live_members(pgid)}")


def _live_members(pgid: int) -> list[int]:
    """Running (non-zombie) processes of a process group. Zombies do not count: when another test
    made this pytest process a child subreaper (the sandbox executor does), orphaned grandchildren
    are reparented here and stay zombies until it reaps them, yet they are dead."""
    alive = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat_file.parent.name))
    return alive


def test_a_dying_server_raises_with_its_log_tail(tmp_path, model):
    server = VllmServer(ServerConfig(model=model), tmp_path / "log", python=script(tmp_path, DIES))
    with pytest.raises(VllmServerError, match=r"(?s)exited with code 3.*unsupported head size 80"):
        server.start(timeout=30)


def test_a_server_that_never_gets_ready_times_out_and_is_stopped(tmp_path, model):
    server = VllmServer(ServerConfig(model=model), tmp_path / "log", python=script(tmp_path, HANGS))
    with pytest.raises(VllmServerError, match="not ready after 1s"):
        server.start(timeout=1)
    assert server.proc.poll() is not None


def test_missing_model_folder_is_refused(tmp_path):
    with pytest.raises(VllmServerError, match="does not exist"):
        VllmServer(ServerConfig(model=tmp_path / "nope"), tmp_path / "log").start()


def test_command_and_env_configure_vllm_for_rl(model):
    cfg = ServerConfig(model=model, tool_call_parser="hermes", enforce_eager=True, threads=1)
    cmd = server_command(cfg, "py", 1234)
    assert "--distributed-executor-backend" not in cmd
    uni = server_command(ServerConfig(model=model, executor_backend="uni"), "py", 1234)
    assert uni[uni.index("--distributed-executor-backend") + 1] == "uni"
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {
        "backend": "gagar_safetensors"
    }
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--logprobs-mode") + 1] == "raw_logprobs"
    assert "--enforce-eager" in cmd and cmd[cmd.index("--tool-call-parser") + 1] == "hermes"
    env = server_env(cfg)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["OMP_NUM_THREADS"] == "1"


def test_cli_serve_dry_run_and_missing_model(model, capsys):
    assert main(["rollout", "serve", "--model", str(model), "--dry-run", "--port", "9001"]) == 0
    out = capsys.readouterr().out
    assert "vllm.entrypoints.openai.api_server" in out and "--port 9001" in out
    assert main(["rollout", "serve", "--model", str(model / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


REAP_SCRIPT = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from gagar.sandbox.runner import become_subreaper
from gagar.rollout.engines.server import _reap_group

assert become_subreaper()
# a group leader that leaves two workers behind, as vLLM's API server does when it dies first
leader = subprocess.Popen(
    [sys.executable, "-c", "import subprocess as s; [s.Popen(['sleep', '60']) for _ in range(2)]"],
    start_new_session=True,
)
leader.wait()
time.sleep(0.3)
os.killpg(leader.pid, signal.SIGKILL)
if sys.argv[1] == "reap":
    _reap_group(leader.pid)
else:
    time.sleep(0.5)
me = os.getpid()
zombies = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        continue
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[0] == "Z" and int(fields[1]) == me:
        zombies.append(pid)
print(len(zombies))
"""


@pytest.mark.parametrize(("mode", "left"), [("reap", "0"), ("no-reap", "2")])
def test_stopping_a_server_reaps_its_reparented_workers(mode: str, left: str) -> None:
    """A subreaper (the sandbox runner makes the driver one) inherits vLLM's orphaned workers;
    ``stop`` must wait for them or they stay zombies for the life of the run."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", REAP_SCRIPT, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == left
