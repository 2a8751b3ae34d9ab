"""Task environments on one machine: a virtual environment per lock, made once, shared read-only.

A task family whose tests need packages of their own names an environment
(``spec.sandbox.environments``: a name and a ``lock``, a requirements file with a hash for every
package). ``ensure(lock, cache)`` makes its virtual environment once and returns its directory:
``python -m venv --without-pip`` with the interpreter this executor runs on (whose installation
every jail mounts), then ``pip install --no-deps --require-hashes -r lock`` into it (a lock is
complete by definition; a package whose file does not match its hash, or a line without a hash,
fails the build). ``LocalFactory(environments={name: directory})`` then mounts the directory
read-only in the jail of every session made for the environment, its ``bin`` first on ``PATH``
and ``VIRTUAL_ENV`` set, so the task's ``python -m pytest`` runs in it (``local.py``).

The cache key is the lock's sha256 and the interpreter (its real path and version): the same lock
with another Python is another environment, a changed lock a new one, and two families with the
same lock share one. Builders never corrupt it: one machine's builders of one key take turns (an
``flock`` per key; the second finds the first's result), and each builds in a temporary directory
of the cache that is renamed into place only once complete (its scripts' ``#!`` lines rewritten
to the final path first), so a directory at the key's path is always a whole environment; a
crashed build leaves only a ``.build-*`` directory, removed by the next builder of that key.

pip comes from the interpreter's ``ensurepip`` wheel (run from the wheel: nothing of pip is
installed into the environment) or, where the installation has none (Debian's), from the
executor's own environment; pip reads its index settings from the lock's own options
(``--index-url``, ``--find-links``, ``--no-index``) and ``PIP_*`` variables, as it always does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "GAGAR_CACHE_DIR"  # as gagar's other per-machine caches (gagar.driver.sft)
BUILD_TIMEOUT_S = 1800.0


class VenvError(RuntimeError):
    """An environment that cannot be made: the lock, pip's output, or what the result lacks."""


def interpreter() -> str:
    """The interpreter environments are made with: the base installation this executor runs on
    (a venv's ``python`` links to it; the jail mounts it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


def key(lock: bytes, python: str) -> str:
    """The cache key of ``lock`` made with ``python``: both digests, 24 hex digits."""
    ident = f"{python}\0{sys.version}\0{sysconfig.get_platform()}".encode()
    return hashlib.sha256(hashlib.sha256(lock).digest() + ident).hexdigest()[:24]


def default_cache() -> Path:
    """``$GAGAR_CACHE_DIR/envs`` (default ``~/.cache/gagar/envs``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gagar") / "envs"


def ensure(lock: Path, cache: Path | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """The environment of ``lock`` in ``cache`` (``default_cache()``), made now if it is not
    there yet."""
    cache = default_cache() if cache is None else cache
    try:
        text = lock.read_bytes()
    except OSError as e:
        raise VenvError(f"lock {lock}: {e.strerror or e}") from None
    python = interpreter()
    dest = cache / f"env-{key(text, python)}"
    if dest.is_dir():
        return dest
    try:
        return _make(dest, lock, text, python, timeout_s)
    except OSError as e:  # the cache cannot be written: no place to make it
        raise VenvError(f"cache {cache}: {e.strerror or e}") from None


def _make(dest: Path, lock: Path, text: bytes, python: str, timeout_s: float) -> Path:
    """``dest`` made, one builder of its key at a time, in a temporary directory beside it."""
    cache = dest.parent
    cache.mkdir(parents=True, exist_ok=True)
    with _turn(cache / f".{dest.name}.lock"):
        if dest.is_dir():  # made by the builder that held the lock before us
            return dest
        for stale in cache.glob(f".build-{dest.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a crashed build's (we hold the key)
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=cache))
        try:
            _build(tmp, lock.resolve(), text, python, timeout_s)
            _relocate(tmp, dest)
            tmp.chmod(0o755)  # mkdtemp's 0700 would keep a leased uid out
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


@contextlib.contextmanager
def _turn(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(venv: Path, lock: Path, text: bytes, python: str, timeout_s: float) -> None:
    """``lock`` installed into a new ``venv`` (``text``: the lock as the key was made of it)."""
    _run([python, "-m", "venv", "--without-pip", str(venv)], "making the environment", timeout_s)
    (venv / "gagar-lock.txt").write_bytes(text)  # what it was made from, for whoever looks
    pip = [*_pip(venv), "install", "--no-deps", "--require-hashes", "--no-input"]
    pip += ["--disable-pip-version-check", "-r", str(lock)]  # its relative paths: its folder's
    _run(pip, "pip install of the lock", timeout_s, cwd=lock.parent)
    own = venv / "bin" / "python"
    probe = _run([str(own), "-I", "-c", "import pytest"], "importing pytest", 120, check=False)
    if probe.returncode != 0:
        why = " ".join(probe.stderr.split()[-12:])
        raise VenvError(
            "its lock installs no pytest that imports, which the tasks' tests run with (add "
            f"pytest and its dependencies, with hashes): {why}"
        )


def unhashed(lock: str) -> list[str]:
    """One line per requirement of ``lock`` (a requirements file's text) without a
    ``--hash``, which ``pip install --require-hashes`` refuses; pip's options (``-``), comments
    and blank lines need none, and ``\\`` continues a line (as ``pip-compile`` writes them)."""
    out, lineno, joined = [], 0, ""
    for n, raw in enumerate(lock.splitlines(), 1):
        lineno = lineno or n
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        req, joined = (joined + line).strip(), ""
        if req and not req.startswith("-") and "--hash=" not in req:
            out.append(f"line {lineno}: {req.split()[0]} has no --hash (pip --require-hashes)")
        lineno = 0
    return out


def _pip(venv: Path) -> list[str]:
    """pip run by the environment's own python: from the ``ensurepip`` wheel where the
    installation ships one (nothing of pip installed), else the executor's own pip
    (``--python``)."""
    import ensurepip

    wheels = sorted(Path(ensurepip.__file__).parent.glob("_bundled/pip-*.whl"))
    if wheels:
        return [str(venv / "bin" / "python"), f"{wheels[-1]}/pip"]
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    raise VenvError("no pip to install the lock with (no ensurepip wheel, no pip here)")


def _run(
    argv: list[str], what: str, timeout_s: float, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False, cwd=cwd
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VenvError(f"{what}: {e}") from None
    if check and done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).split())[-600:]
        raise VenvError(f"{what} failed (exit {done.returncode}): {tail}")
    return done


def _relocate(tmp: Path, dest: Path) -> None:
    """The environment's scripts (``#!`` lines, ``activate``) and ``pyvenv.cfg`` name the path it
    was made at: rewritten to where it is renamed to."""
    old, new = str(tmp).encode(), str(dest).encode()
    for path in [*(tmp / "bin").iterdir(), tmp / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


__all__ = ["VenvError", "default_cache", "ensure", "interpreter", "key", "unhashed"]
