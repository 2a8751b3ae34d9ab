"""The executor under a stock container runtime: containerd's/Docker's default seccomp profile
without ``CAP_SYS_ADMIN`` and a ``/proc`` masked as runc masks it
(``tests/support/stock_runtime.py``), as root with only the capabilities the rendered
``pod``/``auto`` sandbox pods add, or as a non-root user with none.

There bubblewrap cannot create its namespaces; ``auto`` (no flag) must fall back to the ``pod``
mode and say so, ``gagar sandbox exec`` must print ``ok`` and ``gagar sandbox serve`` must serve
sessions and report its mode (``/healthz``, ``gagar_sandbox_isolation``).
"""

from __future__ import annotations

import json
import os
import platform
import site
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gagar.sandbox import isolation, podjail
from gagar.sandbox.client import HttpFactory
from gagar.sandbox.local import LocalFactory
from gagar.sandbox.types import SandboxUnavailable
from tests.support.stock_runtime import masked_proc, wrap

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or os.geteuid() != 0,
    reason="root on x86-64: the test plays the runtime (bounding set, filter)",
)
GAGAR = [sys.executable, "-m", "gagar.cli", "sandbox"]
PRINT_OK = ["python3", "-c", "print('ok')"]
REEXEC = (
    "import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'import gagar.sandbox.cli'])"
)


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


def test_bubblewrap_cannot_start_under_the_stock_profile() -> None:
    """The failure the pod mode exists for, reproduced."""
    out = _run(wrap([*GAGAR, "exec", "--isolation", "bubblewrap", "--", *PRINT_OK]))
    assert out.returncode == 3, out.stderr
    assert "Creating new namespace failed: Operation not permitted" in out.stderr


def test_exec_with_no_flag_prints_ok() -> None:
    out = _run(wrap([*GAGAR, "exec", "--", *PRINT_OK]))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["stdout"] == "ok\n" and result["exit_code"] == 0
    assert "isolation pod (auto: bubblewrap cannot run here" in out.stderr


def test_each_session_runs_as_its_own_uid_without_capabilities() -> None:
    probe = "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
    out = _run(wrap([*GAGAR, "exec", "--", "sh", "-c", probe]))
    lines = json.loads(out.stdout)["stdout"].split("\n")
    assert int(lines[0]) >= 1_500_000  # a leased uid, not the executor's root
    assert lines[1:4] == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"]


def test_check_reports_the_mode_auto_takes() -> None:
    out = _run(wrap([*GAGAR, "check"]))
    assert out.returncode == 0 and out.stdout == "sandbox isolation available (pod)\n"
    refused = _run(wrap([*GAGAR, "check", "--isolation", "bubblewrap"]))
    assert refused.returncode == 3 and "isolation bubblewrap does not work here" in refused.stderr


def test_serve_under_the_stock_profile_serves_and_reports_its_mode() -> None:
    proc = subprocess.Popen(
        wrap([*GAGAR, "serve", "--port", "0"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip().rsplit(" ", 1)[1]  # type: ignore[union-attr]
        health = httpx.get(f"{url}/healthz").json()
        assert health["isolation"] == "pod"
        with HttpFactory(url).create(files={"t.py": "print('ok')"}) as s:
            assert s.exec(["python3", "t.py"]).stdout == "ok\n"
            port = url.rsplit(":", 1)[1]
            reach = f"import socket; socket.create_connection(('127.0.0.1', {port}))"
            r = s.exec(["python3", "-c", reach])  # its own executor's port, in the same pod
            assert r.exit_code == 1 and "PermissionError" in r.stderr
        metrics = httpx.get(f"{url}/metrics").text
        assert 'gagar_sandbox_isolation{mode="pod"' in metrics
        line = next(x for x in metrics.splitlines() if x.startswith("gagar_sandbox_isolation{"))
        assert line.endswith(" 1.0") == ('mode="pod"' in line)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "gagar sandbox: isolation pod (auto:" in err


def test_a_non_root_executor_runs_pod_mode_and_says_its_limit(tmp_path: Path) -> None:
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # this interpreter may live under a home only root may enter: the system's, on our packages
    paths = os.pathsep.join([os.getcwd(), *site.getsitepackages()])
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": paths}
    python = next(
        (
            p
            for p in (sys.executable, "/usr/bin/python3")
            if _run([*nobody, p, "-c", REEXEC], env=env).returncode == 0
        ),
        None,
    )
    if python is None:
        pytest.skip("no interpreter an unprivileged user may run gagar with")
    tmp_path.chmod(0o777)
    argv = [python, "-m", "tests.support.stock_runtime", "--", python, "-m", "gagar.cli"]
    out = _run([*masked_proc(), *nobody, *argv, "sandbox", "exec", "--", *PRINT_OK], env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stdout"] == "ok\n"
    assert "isolation pod (auto:" in out.stderr
    assert "pod-mode sessions share its uid: run one session per pod" in out.stderr


def test_auto_takes_bubblewrap_where_namespaces_work() -> None:
    choice = isolation.choose("auto")
    assert choice.mode == "bubblewrap" and choice.backend == "bwrap"


def test_a_launcher_that_cannot_start_is_an_infrastructure_error(monkeypatch) -> None:
    monkeypatch.setattr(podjail, "filter_bpf", lambda ip_sockets: b"\xff" * 8)  # not a program
    with LocalFactory(isolation="pod", check=False).create(files={}) as s:
        r = s.exec("echo 'gagar pod jail: fake' >&2; exit 1")
    assert not r.ok and r.infra_error and "the pod jail did not start" in r.infra_error
    assert "cannot load the seccomp filter" in r.infra_error


def test_a_session_root_its_uids_cannot_pass_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(SandboxUnavailable, match="cannot pass through"):
        LocalFactory(isolation="pod", root=str(closed))


def test_sessions_cannot_read_each_other(tmp_path: Path) -> None:
    factory = LocalFactory(isolation="pod")
    with factory.create(files={"secret.txt": "A-ONLY"}) as a, factory.create(files={}) as b:
        assert a.uid != b.uid
        r = b.exec(["cat", str(a.workspace / "secret.txt")])
        assert r.exit_code != 0 and "A-ONLY" not in r.stdout
        assert b.exec(["ls", str(a.dir)]).exit_code != 0  # nor list the other's directory


@pytest.mark.parametrize(
    ("asked", "runs"), [("pod", "pod"), ("bubblewrap", "bwrap"), ("auto", "bwrap")]
)
def test_the_embedded_trainer_takes_the_specs_mode(asked: str, runs: str) -> None:
    from gagar.driver.components import sandbox_factory
    from gagar.spec import SandboxSpec

    factory = sandbox_factory(SandboxSpec(isolation=asked))  # type: ignore[arg-type]
    assert factory.isolation == runs  # auto: namespaces work on this machine
    with factory.create(files={}) as s:
        assert s.exec(["python3", "-c", "print('ok')"]).stdout == "ok\n"
