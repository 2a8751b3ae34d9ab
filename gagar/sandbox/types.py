"""Types of the sandbox API: limits, the result of one command, the session and factory
protocols, what a session is made of (``SessionRequest``), errors.

Every backend (local bubblewrap, the HTTP client of an executor server) implements ``Session``,
and its factory subclasses ``SessionFactory`` (or ``VerificationFactory``) and defines ``open``;
callers (agent tools, verifiers, graders) depend only on this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

MAX_WALL_S = 3600.0  # the longest any command may run, whatever a caller asks
LimitKind = Literal["wall_time", "cpu_time", "memory", "processes", "file_size", "disk"]
Isolation = Literal["bwrap", "pod", "none"]  # how a LocalFactory runs commands (isolation.py)
FileData = bytes | str


class SandboxError(Exception):
    """A request the sandbox refuses (bad path, unknown session, missing file)."""


class SandboxUnavailable(SandboxError):
    """Isolation cannot be provided here, so untrusted code must not run."""


class SandboxInfraError(SandboxError):
    """The sandbox machinery failed (not the code under test)."""


class Limits(BaseModel):
    """Resource limits of one command. Small defaults: agent commands and unit tests are short."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    wall_time_s: float = Field(
        default=60.0, gt=0, le=MAX_WALL_S, description="Wall clock per command."
    )
    cpu_time_s: int = Field(default=60, ge=1, le=3600, description="CPU seconds (RLIMIT_CPU).")
    memory_bytes: int = Field(
        default=2 << 30,
        ge=32 << 20,
        le=1 << 40,
        description="Memory (cgroup when available; RLIMIT_AS).",
    )
    processes: int = Field(default=64, ge=4, le=4096, description="Processes/threads at once.")
    open_files: int = Field(default=256, ge=16, le=65536, description="RLIMIT_NOFILE.")
    file_size_bytes: int = Field(
        default=64 << 20, ge=1 << 16, le=1 << 40, description="RLIMIT_FSIZE."
    )
    output_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=64 << 20,
        description="Captured stdout and stderr, each; the rest is dropped.",
    )
    disk_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        le=1 << 40,
        description="Workspace and /tmp together (a size-limited tmpfs when the executor is root).",
    )
    inodes: int = Field(
        default=100_000, ge=64, le=10_000_000, description="Files and directories, together."
    )
    shm_bytes: int = Field(
        default=64 << 20, ge=1 << 20, le=1 << 40, description="Size of the writable /dev/shm."
    )


class ExecResult(BaseModel):
    """What happened to one command. Only facts the executor observed itself, never the code's word.

    ``infra_error`` is set when the sandbox machinery failed (the command may not have run); such a
    result must be treated as invalid, never as a test failure.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None = Field(description="Exit status; None when killed by a signal.")
    signal: int | None = Field(default=None, description="Terminating signal, if any.")
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = Field(default=False, description="Killed by the executor at the wall clock.")
    limit_hit: LimitKind | None = Field(default=None, description="Resource limit that ended it.")
    truncated: bool = Field(default=False, description="Output was longer than the cap.")
    duration_s: float = 0.0
    cpu_time_s: float = Field(default=0.0, description="User + system CPU of the whole tree.")
    infra_error: str | None = None
    warm: bool = Field(default=False, description="Ran in the session's warm test runner.")
    warm_fallback: str | None = Field(
        default=None, description="Why a pytest command the warm runner takes ran cold."
    )

    @property
    def ok(self) -> bool:
        """The command ran and exited 0."""
        return self.infra_error is None and self.exit_code == 0

    def describe(self) -> str:
        """One line for logs and agent observations."""
        if self.infra_error:
            return f"sandbox error: {self.infra_error}"
        parts = [f"exit={self.exit_code}" if self.signal is None else f"signal={self.signal}"]
        if self.timed_out:
            parts.append("timed out")
        if self.limit_hit:
            parts.append(f"limit hit: {self.limit_hit}")
        if self.truncated:
            parts.append("output truncated")
        return ", ".join(parts)


Command = str | Sequence[str]


@runtime_checkable
class Session(Protocol):
    """A workspace plus the right to run commands in it, isolated.

    Paths are relative to the workspace root (``/workspace`` inside the sandbox). A ``str`` command
    runs through ``/bin/sh -c``; a sequence runs as an argv. No process of the session survives a
    call to ``exec`` (but a local session's warm runner, a fork server none of them can steer:
    ``warm.py``).
    """

    def exec(self, cmd: Command, timeout: float | None = None) -> ExecResult: ...
    def read_file(self, path: str) -> bytes: ...
    def write_file(self, path: str, data: FileData) -> None: ...
    def delete_file(self, path: str) -> None: ...
    def list_files(self) -> list[str]: ...
    def diff(self) -> str: ...
    def archive(self) -> bytes: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class SessionRequest:
    """What one session is made of, as ``SessionFactory.open`` takes it: the workspace (a files
    mapping or a ``.tar.gz`` snapshot, not both; neither: empty), the limits of its commands (None:
    the factory's), its task environment (a name of ``spec.sandbox.environments``; None: the
    executor's own Python), its task image (``image``: a row's own container image, on sandbox
    pods the executor pool of that image; None: the run's) and, for a verification,
    ``verification`` and the modules its fork server imports besides pytest (``preload``).
    Checked as it is made: a factory never sees one that asks the impossible."""

    files: Mapping[str, FileData] | None = None
    tarball: bytes | None = None
    limits: Limits | None = None
    environment: str | None = None
    verification: bool = False
    preload: tuple[str, ...] = ()
    image: str | None = None

    def __post_init__(self) -> None:
        if self.verification and (self.tarball is None or self.files is not None):
            raise SandboxError("a verification session needs a tarball")
        if self.files is not None and self.tarball is not None:
            raise SandboxError("give files or a tarball, not both")
        if self.image is not None and self.environment is not None:
            raise SandboxError("give a task environment or a task image, not both")

    def for_one_image(self, where: str, limits: Limits | None) -> SessionRequest:
        """The request as an executor of one image (``where``) takes it: refused when it names an
        environment or an image, with ``limits`` where it names none (None: the executor's own)."""
        if self.environment is not None:
            raise SandboxError(
                f"{where} has no environment {self.environment!r}: it runs one image"
            )
        if self.image is not None:
            raise SandboxError(f"{where} cannot run the task image {self.image!r}: it runs one")
        return self if self.limits is not None else replace(self, limits=limits)


class SessionFactory(Protocol):
    """Creates sessions from a files mapping (a task's repository) or a ``.tar.gz`` snapshot.
    ``environment``: the task environment the session's commands run in (a name of
    ``spec.sandbox.environments``; None: the executor's own Python); a factory without it raises
    ``SandboxError`` naming the environment.

    A factory defines ``open``; ``create`` (and ``VerificationFactory.verification_session``)
    check the arguments into a ``SessionRequest`` and hand it there, so a factory that subclasses
    this protocol writes neither the signature nor its checks again."""

    def open(self, request: SessionRequest) -> Session:
        """A new session as ``request`` says (the one method an implementation defines)."""
        ...

    def create(
        self,
        files: Mapping[str, FileData] | None = None,
        tarball: bytes | None = None,
        limits: Limits | None = None,
        environment: str | None = None,
        image: str | None = None,
    ) -> Session:
        return self.open(SessionRequest(files, tarball, limits, environment, image=image))


@runtime_checkable
class VerificationFactory(SessionFactory, Protocol):
    """A factory that keeps sessions for verification (``LocalFactory``: ``station.py``; the
    executor servers' clients). ``isinstance`` looks for ``open`` too: a wrapper (a test's, a
    benchmark's) subclasses this and defines ``open``."""

    def verification_session(
        self,
        tarball: bytes,
        preload: tuple[str, ...] = (),
        limits: Limits | None = None,
        environment: str | None = None,
        image: str | None = None,
    ) -> Session:
        """A session on ``tarball`` for one verification: a station (``station.py``) whose fork
        server imported pytest and ``preload`` once where the factory keeps them (its sessions run
        warm), else a fresh one. Stations are kept per environment: a fork server of one never
        serves another."""
        request = SessionRequest(
            None, tarball, limits, environment, verification=True, preload=preload, image=image
        )
        return self.open(request)
