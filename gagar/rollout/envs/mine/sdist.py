"""A pinned source distribution: fetched once into a cache with ``pip download``, or a local file;
its sha256 recorded (and checked when the caller pins one), its files unpacked in memory.

Unpacking keeps regular files only, strips the sdist's top directory, and refuses absolute paths
and ``..``; an archive larger than ``MAX_BYTES`` unpacked is refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAX_BYTES = 256 << 20
SUFFIXES = (".tar.gz", ".tgz", ".zip", ".tar.bz2")


class SdistError(ValueError):
    """The distribution cannot be fetched, is not the pinned one, or cannot be unpacked."""


@dataclass(frozen=True)
class Sdist:
    name: str
    version: str
    sha256: str
    files: dict[str, bytes]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split_pin(pin: str) -> tuple[str, str]:
    name, sep, version = pin.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise SdistError(f"{pin!r}: give name==version (a pinned release) or a local sdist file")
    return name.strip(), version.strip()


def _cached(cache: Path, name: str, version: str) -> Path | None:
    for path in sorted(cache.glob("*")):
        try:
            found = _name_version(path.name)
        except SdistError:
            continue
        if (normalize(found[0]), found[1]) == (normalize(name), version):
            return path
    return None


def _pip() -> list[str]:
    """pip of this interpreter, else the first on PATH (a uv-made environment has none)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    raise SdistError("no pip here to download with: give a local sdist file")


def fetch(pin: str, cache: Path) -> Path:
    """The sdist of ``name==version`` from ``cache``, downloaded there with pip when missing."""
    name, version = _split_pin(pin)
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached(cache, name, version)
    if found is not None:
        return found
    # --no-binary for this package only: pip still prepares the metadata after saving the file,
    # and with :all: it first builds its build backend (setuptools, hatchling) from source too:
    # 400 s for toolz on a busy machine, for metadata the miner never reads.
    cmd = [*_pip(), "download", "--no-deps", "--no-binary", name, "--dest", str(cache)]
    done = subprocess.run(
        [*cmd, f"{name}=={version}"], capture_output=True, text=True, timeout=600, check=False
    )
    # pip saves the file before it prepares the metadata, which an older pip can fail on
    # (tinydb 4.8.0's python_requires with pip 23.2): the file is what is needed, not the metadata
    found = _cached(cache, name, version)
    if found is None:
        tail = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise SdistError(f"pip download {name}=={version}: {tail}")
    return found


def load(source: str, cache: Path, sha256: str | None = None) -> Sdist:
    """``source``: ``name==version`` (through the cache) or a path to an sdist file."""
    path = Path(source)
    if path.is_file():
        name, version = _name_version(path.name)
    else:
        path = fetch(source, cache)
        name, version = _split_pin(source)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise SdistError(f"{path.name}: sha256 {digest} is not the pinned {sha256}")
    return Sdist(normalize(name), version, digest, unpack(data, path.name))


def _name_version(filename: str) -> tuple[str, str]:
    for suffix in SUFFIXES:
        if filename.endswith(suffix):
            name, _, version = filename[: -len(suffix)].rpartition("-")
            if name and version:
                return name, version
    raise SdistError(f"{filename}: not an sdist file name (name-version.tar.gz)")


def unpack(data: bytes, filename: str) -> dict[str, bytes]:
    """The regular files of the archive, its top directory stripped."""
    members: dict[str, bytes] = {}
    if filename.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    members[info.filename] = zf.read(info)
    else:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    members[m.name] = tar.extractfile(m).read()  # type: ignore[union-attr]
    if sum(map(len, members.values())) > MAX_BYTES:
        raise SdistError(f"{filename}: more than {MAX_BYTES} bytes unpacked")
    out = {}
    for name, body in members.items():
        parts = PurePosixPath(name).parts
        if name.startswith("/") or ".." in parts or len(parts) < 2:
            raise SdistError(f"{filename}: member {name!r} is outside the sdist's directory")
        out[str(PurePosixPath(*parts[1:]))] = body
    return dict(sorted(out.items()))
