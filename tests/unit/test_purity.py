"""The pure modules import no I/O, cluster, HTTP or distributed code (beyond what import-linter checks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "gagar/spec.py",
    "gagar/crd.py",
    "gagar/trainer/gar.py",
    "gagar/trainer/loss.py",
    "gagar/operator/status.py",
    "gagar/grader/heuristic.py",
    "gagar/grader/bounds.py",
]
PURE_DIRS = ["gagar/operator/builders"]
FORBIDDEN = (
    "torch.distributed",
    "kopf",
    "kubernetes",
    "httpx",
    "requests",
    "aiohttp",
    "megatron",
    "vllm",
    "socket",
    "subprocess",
    "gagar.sandbox",
)


def _files() -> list[Path]:
    files = [ROOT / p for p in PURE if (ROOT / p).exists()]
    for d in PURE_DIRS:
        files += sorted((ROOT / d).glob("*.py"))
    return files


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"
