"""Shared pytest configuration.

Markers follow directories: every test under ``tests/e2e`` is ``e2e`` and every test under
``tests/gpu`` is ``gpu`` whether its file says so or not, and a test that carries either marker
anywhere else is a collection error (move the file instead), so ``-m "not e2e"`` is exactly "not
under tests/e2e". GPU tests skip cleanly without CUDA. The header says how much disk and memory the
run starts with (a CI machine short of either fails in many places at once).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ("pytester",)  # tests/unit/test_suite_layout.py runs pytest on scratch trees

TESTS = Path(__file__).resolve().parent
# marker -> the directory that holds exactly the tests that carry it
MARKER_DIRS = {"e2e": TESTS / "e2e", "gpu": TESTS / "gpu"}
# Under xdist (`-n N --dist loadfile`) a file's tests stay on one worker, so its module-scoped
# servers start once; these files' fixtures are all per test, so their tests spread over the workers
# (the operator scenarios, each with its own API emulator, were a third of the default suite's
# wall time on one worker).
SPREAD_FILES = frozenset({TESTS / "integration" / "test_operator_scenarios.py"})
# The files that take a worker longest (servers, torchrun ranks, Megatron): handed out first, so
# the run does not end with one worker alone on one of them while the other idles.
FIRST_FILES = tuple(
    TESTS / name
    for name in (
        "integration/test_vllm_engine.py",
        "integration/test_model_parallel.py",
        "integration/test_learner_data_parallel.py",
    )
)

# pytest-xdist workers share the CPUs: each worker's torch (and whatever it spawns without its own
# setting) gets its share of threads, not all of them, or the workers' OpenMP pools oversubscribe
# the cores and spin against each other
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))

# `gagar train` keeps warm-started policies per machine (gagar.driver.sft): tests keep theirs in a
# fresh folder of their own, so a test never starts from a policy another session left behind
os.environ.setdefault("GAGAR_CACHE_DIR", tempfile.mkdtemp(prefix="gagar-test-cache-"))


def pytest_report_header(config: pytest.Config) -> str:
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    mem = int(meminfo["MemAvailable"].split()[0]) / 2**20
    return f"resources: {free:.1f} GiB free in {tmp}, {mem:.1f} GiB memory available, {os.cpu_count()} CPUs"


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def pytest_itemcollected(item: pytest.Item) -> None:
    for marker, folder in MARKER_DIRS.items():
        if _under(item.path, folder):
            item.add_marker(marker)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = [
        f"{item.nodeid} is marked {marker} outside {folder.relative_to(TESTS.parent)}/"
        for item in items
        for marker, folder in MARKER_DIRS.items()
        if item.get_closest_marker(marker) is not None and not _under(item.path, folder)
    ]
    if misplaced:
        raise pytest.UsageError("markers follow directories:\n  " + "\n  ".join(misplaced))
    on_gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not on_gpu:
        return  # torch is imported only when a GPU test is selected
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in on_gpu:
        item.add_marker(skip)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` as this suite needs it (see SPREAD_FILES and FIRST_FILES).

    Not ``xdist_group`` marks with ``--dist loadgroup``: pytest-xdist 3.8 groups them by appending
    the group to the test's node id, which pytest 9.2 no longer lets a plugin change
    (pytest-dev/pytest-xdist#1386), so the marks were silently ignored and a file's module-scoped
    vLLM servers started on both workers at once.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath
    spread = {str(path.relative_to(root)) for path in SPREAD_FILES}
    first = [str(path.relative_to(root)) for path in FIRST_FILES]

    class FileScheduling(LoadScopeScheduling):
        """One work unit per file (per test in SPREAD_FILES), FIRST_FILES at the queue's head."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return nodeid if file in spread else file

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is complete before the first unit is handed out
                self.ordered = True
                for file in reversed(first):
                    if file in self.workqueue:
                        self.workqueue.move_to_end(file, last=False)
            super()._assign_work_unit(node)

    return FileScheduling(config, log)
