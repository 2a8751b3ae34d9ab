"""Shared pytest configuration: GPU tests skip cleanly without CUDA; the header says how much
disk and memory the run starts with (a CI machine short of either fails in many places at once)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# `gagar train` keeps warm-started policies per machine (gagar.driver.sft): tests keep theirs in a
# fresh folder of their own, so a test never starts from a policy another session left behind
os.environ.setdefault("GAGAR_CACHE_DIR", tempfile.mkdtemp(prefix="gagar-test-cache-"))


def pytest_report_header(config: pytest.Config) -> str:
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 2**30
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    mem = int(meminfo["MemAvailable"].split()[0]) / 2**20
    return f"resources: {free:.1f} GiB free in {tmp}, {mem:.1f} GiB memory available, {os.cpu_count()} CPUs"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
