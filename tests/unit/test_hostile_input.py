"""Hostile manifests and arguments: refused with one clear line and a non-zero exit, never a
traceback, never accepted as valid (issue 21, item 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.crd import build_crd
from gagar.spec import MAX_NUMBER

HEAD = "apiVersion: gagar.dev/v1alpha1\nkind: GagarRun\nmetadata: {name: x}\n"
SPEC = "spec:\n  model: {preset: tiny}\n  rollout: {replicas: 1}\n  grader: {replicas: 1}\n"


def _validate(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    rc = main(["validate", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out + out.err


@pytest.mark.parametrize(
    "text,message",
    [
        ("a: " + "[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
        ("a:\n" + "".join(f"{' ' * i}b{i}:\n" for i in range(1, 200)), "nested deeper than"),
        ("a: " + "9" * 5000, "invalid YAML: Exceeds the limit"),
        ("a: '" + "x" * (2 << 20) + "'", "larger than 1048576 bytes"),
        (HEAD + "kind: GagarRun\n" + SPEC, "duplicate key 'kind' (line 4)"),
        (
            HEAD + SPEC + "  algorithm: {optimizer: {lr: .inf}}\n",
            "optimizer.lr: Input should be a finite",
        ),
        (
            HEAD
            + SPEC.replace(
                "replicas: 1}\n  grader", "replicas: 1, agent: {temperature: .nan}}\n  grader"
            ),
            "agent.temperature: Input should be a finite",
        ),
        (HEAD + SPEC + "  sandbox: {limits: {memoryBytes: 1.0e+23}}\n", "limits.memoryBytes"),
        (
            HEAD + SPEC + "  sandbox: {limits: {diskBytes: 10000000000000000}}\n",
            "less than or equal",
        ),
        (HEAD + SPEC + "  algorithm: {seed: -10000000000000000}\n", "out of range"),
    ],
    ids=[
        "deep-flow",
        "deep-block",
        "huge-int",
        "huge-file",
        "dup-key",
        "inf",
        "nan",
        "1e23",
        "1e16",
        "neg",
    ],
)
def test_hostile_manifest_is_one_clear_line(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    rc, out = _validate(tmp_path, text, capsys)
    assert rc == 1
    assert message in out
    assert len(out.strip().splitlines()) == 1, out


def test_crd_bounds_every_number() -> None:
    """The API server refuses what pydantic refuses: every number has finite bounds."""
    unbounded = []

    def visit(node, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                if not (abs(node.get("maximum", 1e300)) <= MAX_NUMBER and "minimum" in node):
                    unbounded.append(path)
            for k, v in node.items():
                visit(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(v, f"{path}[{i}]")

    for version in build_crd()["spec"]["versions"]:
        visit(version["schema"], version["name"])
    assert unbounded == []


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--steps", "-5"], "invalid override: spec.algorithm.totalSteps"),
        (["--out", "FILE"], "cannot use --out"),
        (["--out", "/proc/x"], "cannot use --out"),
    ],
)
def test_train_bad_arguments_exit_2_in_one_line(
    tmp_path: Path, capsys, monkeypatch, extra: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("a file, not a directory")
    (tmp_path / "run.yaml").write_text(HEAD + SPEC)
    rc = main(["train", "run.yaml", *extra])
    out = capsys.readouterr()
    assert rc == 2
    assert message in out.err and "Traceback" not in out.err
    assert len(out.err.strip().splitlines()) == 1, out.err


def test_rendered_run_json_is_json(tmp_path: Path, capsys) -> None:
    """Whatever validates renders as strict JSON (no Infinity/NaN tokens)."""
    path = tmp_path / "run.yaml"
    path.write_text(HEAD + SPEC + "  algorithm: {optimizer: {lr: 1.0e-4}}\n")
    assert main(["validate", str(path)]) == 0
    from gagar.manifest import load_run

    json.loads(json.dumps(load_run(path).to_wire(), allow_nan=False))
