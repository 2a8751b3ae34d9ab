"""Atomic, resumable checkpoints.

A checkpoint is a directory ``step_<N>`` holding torch-serialized parts (model, optimizer, scheduler,
RNG states, data-sampler position, ...) and ``state.json`` (step, policy version, metrics so far).
It is complete iff its ``COMPLETE`` manifest exists and every file it lists has the recorded size and
SHA-256. Writing goes to ``step_<N>.tmp-<pid>``; files are fsync'ed, the manifest is written last,
then the directory is renamed into place and the parent fsync'ed. A kill at any moment therefore
leaves either the previous complete checkpoint or the new one, never a half-written one that
``latest`` would pick; leftovers are removed on the next save.

Loading cannot run code: parts are read with ``torch.load(weights_only=True)`` (tensors,
numbers, strings and containers of them; a pickle that names any other callable is refused), and
``state.json`` is plain JSON. A checkpoint that fails any check (manifest shape, sizes, checksums,
a ``state.json`` of the wrong shape or with a number that is not a finite count, a part that does
not load or holds a non-finite float) is skipped with a warning naming it, and ``candidates``
offers the previous one.

Guarantees: no step is lost or repeated across a kill as long as the driver checkpoints *after* a
step's update and its metrics record, and truncates ``metrics.jsonl`` to the resumed step
(``truncate_jsonl``). What it does not protect against: a filesystem that lies about fsync, or
two writers on one directory (one trainer per run directory).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST = "COMPLETE"
STATE = "state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


_Count = Annotated[int, Field(ge=0, le=2**53)]  # exact in JSON and float64 alike


class _SamplerState(BaseModel):
    """The task sampler's position (``TaskSampler.state``): counts, never negative."""

    model_config = ConfigDict(extra="allow", strict=True)
    epoch: _Count | None = None
    pos: _Count | None = None
    drawn: _Count | None = None
    epochs: list[_Count] | None = None
    positions: list[_Count] | None = None


class _State(BaseModel):
    """What resume reads from ``state.json``; other keys (metrics) are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)
    step: _Count
    policy_version: _Count | None = None
    sampler: _SamplerState | None = None
    layout: dict[str, Annotated[int, Field(ge=1, le=1 << 20)]] | None = None
    python_rng: str | None = None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(obj: Any, file: Path) -> Any:
    """``obj`` if every floating tensor in it is finite, else ``CheckpointError`` naming ``file``."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and not bool(torch.isfinite(item).all()):
                raise CheckpointError(f"{file}: holds a tensor that is not finite (NaN or inf)")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return obj


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path

    def state(self) -> dict[str, Any]:
        """``state.json``, checked for shape and finiteness before anyone uses it."""
        file = self.path / STATE
        try:
            state = json.loads(file.read_text(), parse_constant=_refuse_constant)
            _State.model_validate(state)
        except ValidationError as err:
            where = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in err.errors()[:3]
            )
            raise CheckpointError(f"{file}: malformed: {where}") from None
        except (OSError, ValueError, RecursionError) as err:  # RecursionError: nested past json's
            raise CheckpointError(f"{file}: unreadable: {type(err).__name__}: {err}") from None
        if state["step"] != self.step:
            raise CheckpointError(f"{file}: says step {state['step']}, its directory {self.step}")
        return state

    def load(self, part: str, map_location: str | torch.device = "cpu") -> Any:
        """Load one torch-serialized part (e.g. ``model``, ``optimizer``, ``rng``); tensors and
        plain data only (``weights_only``): a part that would run code is a ``CheckpointError``."""
        file = self.path / f"{part}.pt"
        if not file.exists():
            raise CheckpointError(f"{self.path}: no part {part!r}")
        try:
            loaded = torch.load(file, map_location=map_location, weights_only=True)
        except Exception as err:  # UnpicklingError, RuntimeError, EOFError, ...: all "bad part"
            raise CheckpointError(f"{file}: cannot load: {type(err).__name__}: {err}") from err
        return _finite(loaded, file)


def _fsync_write(path: Path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves, finds, verifies and prunes the checkpoints under one directory."""

    def __init__(self, root: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, parts: dict[str, Any], state: dict[str, Any]) -> Checkpoint:
        """Write ``parts`` (torch-serializable) and ``state`` (JSON) as the checkpoint of ``step``."""
        staging = self.stage(step, str(os.getpid()))
        return self.commit(step, staging, self.write_parts(staging, parts), state)

    def stage(self, step: int, tag: str) -> Path:
        """An empty staging directory for ``step`` (leftovers of interrupted saves removed).

        Several processes may write parts into it (``write_parts``, one set of names each);
        exactly one then ``commit``s it with every writer's file records.
        """
        self._remove_leftovers()
        tmp = self.staging_path(step, tag)
        tmp.mkdir()
        return tmp

    def staging_path(self, step: int, tag: str) -> Path:
        """Where ``stage(step, tag)`` puts its directory (for the other writers)."""
        return self.root / f"step_{step:08d}.tmp-{tag}"

    def write_parts(self, staging: Path, parts: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Write and fsync ``<name>.pt`` per part; returns their manifest records."""
        files = {}
        for name, obj in parts.items():
            buf = io.BytesIO()
            torch.save(obj, buf)
            files[f"{name}.pt"] = self._write(staging / f"{name}.pt", buf.getvalue())
        return files

    def commit(
        self, step: int, staging: Path, files: dict[str, dict[str, Any]], state: dict[str, Any]
    ) -> Checkpoint:
        """Write ``state`` and the manifest (last), then rename the staging directory into place."""
        files = {
            **files,
            STATE: self._write(staging / STATE, json.dumps({**state, "step": step}).encode()),
        }
        self._write(staging / MANIFEST, json.dumps({"step": step, "files": files}).encode())
        _fsync_dir(staging)
        final = self.root / f"step_{step:08d}"
        if (
            final.exists()
        ):  # a complete checkpoint of the same step (re-run after a kill): replace it
            shutil.rmtree(final)
        os.rename(staging, final)
        _fsync_dir(self.root)
        self._prune()
        return Checkpoint(step, final)

    @staticmethod
    def _write(path: Path, data: bytes) -> dict[str, Any]:
        return {"sha256": _fsync_write(path, data), "size": len(data)}

    def verify(self, path: Path) -> None:
        """Raise ``CheckpointError`` naming the first problem of the checkpoint at ``path``."""
        manifest = path / MANIFEST
        if not manifest.exists():
            raise CheckpointError(f"{path}: incomplete (no {MANIFEST} manifest)")
        try:
            files = json.loads(manifest.read_text())["files"]
            records = [(str(n), int(m["size"]), str(m["sha256"])) for n, m in files.items()]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{path}: malformed manifest: {err!r}") from err
        for name, size, sha256 in records:
            file = path / name
            if file.parent != path or not file.is_file() or file.stat().st_size != size:
                raise CheckpointError(f"{path}: {name} is missing or has the wrong size")
            if hashlib.sha256(file.read_bytes()).hexdigest() != sha256:
                raise CheckpointError(f"{path}: {name} does not match its checksum")

    def complete(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest first (incomplete or corrupt ones are skipped)."""
        found = []
        for path in sorted(self.root.iterdir()) if self.root.exists() else []:
            match = _STEP_DIR.match(path.name)
            if match and (path / MANIFEST).exists():
                found.append(Checkpoint(int(match.group(1)), path))
        return found

    def candidates(self) -> Iterator[Checkpoint]:
        """Verified checkpoints, newest first; each bad one is reported and skipped. A caller whose
        load of a candidate fails (``CheckpointError``) warns with ``skip`` and takes the next."""
        for ckpt in reversed(self.complete()):
            try:
                self.verify(ckpt.path)
                ckpt.state()  # its shape and numbers, before a caller reads it
            except CheckpointError as err:
                skip(err)
                continue
            yield ckpt

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; corrupt newer ones are reported and skipped."""
        return next(self.candidates(), None)

    def _prune(self) -> None:
        for ckpt in self.complete()[: -self.keep]:
            shutil.rmtree(ckpt.path, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        for path in self.root.glob("step_*.tmp-*"):
            shutil.rmtree(path, ignore_errors=True)


def skip(err: Exception) -> None:
    """The warning for a checkpoint that is passed over (it names the checkpoint and why)."""
    print(f"gagar: skipping checkpoint: {err}", file=sys.stderr)


def truncate_jsonl(path: str | Path, max_step: int) -> int:
    """Drop records with ``step > max_step`` (and a torn last line) from a JSONL log; return kept."""
    path = Path(path)
    if not path.exists():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # torn write from a kill mid-append
        if int(record.get("step", 0)) <= max_step:
            kept.append(line)
    tmp = path.with_suffix(path.suffix + ".tmp")
    _fsync_write(tmp, ("\n".join(kept) + "\n" if kept else "").encode())
    os.replace(tmp, path)
    return len(kept)
