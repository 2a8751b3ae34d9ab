"""The light commands stay light: ``gagar --help``, ``validate`` and ``render`` import neither torch
nor Megatron nor vLLM (nor transformers, nor kopf), so they answer in well under a second and run
in the operator image, which has none of them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "megatron", "vllm", "transformers", "kopf")

PROBE = """
import contextlib, io, json, sys
from gagar.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(json.loads(sys.argv[1]))
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))))
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["validate", "examples/local.yaml"], ["render", "examples/local.yaml"]],
    ids=["help", "validate", "render"],
)
def test_light_commands_import_no_heavy_library(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout) == []


def test_the_model_package_still_exports_its_api() -> None:
    import gagar.trainer.model as model

    with pytest.raises(AttributeError):
        _ = model.not_a_name  # type: ignore[attr-defined]
    assert model.Parallel.__name__ == "Parallel"
