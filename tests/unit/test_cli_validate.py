"""`gagar validate` and `gagar crd`: messages with file, document index and field path; exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gagar.cli import main
from gagar.manifest import load_run

ROOT = Path(__file__).resolve().parents[2]
GOOD = """apiVersion: gagar.dev/v1alpha1
kind: GagarRun
metadata: {name: ok}
spec:
  model: {preset: tiny}
  rollout: {replicas: 1}
  grader: {replicas: 1}
"""
BAD = """apiVersion: gagar.dev/v1alpha1
kind: GagarRun
metadata: {name: bad}
spec:
  model: {preset: tiny}
  rollout: {replicas: 1}
  grader: {replicas: 1, autoscaling: {maxReplicas: 2}}
  algorithm: {groupSize: 1}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_valid_multi_document_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(
        tmp_path, "runs.yaml", GOOD + "---\n" + GOOD.replace("name: ok", "name: ok2") + "---\n"
    )
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}[0]" in out and f"{path}[1]" in out


def test_every_problem_is_printed_with_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "runs.yaml", GOOD + "---\n" + BAD)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}[1]: spec.grader:" in err
    assert f"{path}[1]: spec.algorithm.groupSize:" in err
    assert f"{path}[0]" not in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "not a GagarRun"),
        ("- just\n- a list\n", "expected a mapping"),
        ("key: [unclosed\n", "invalid YAML"),
        ("", "no YAML documents"),
    ],
)
def test_clear_errors_for_non_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = _write(tmp_path, "x.yaml", text)
    assert main(["validate", str(path)]) == 1
    assert expected in capsys.readouterr().err


NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: gagar}\n"


def test_a_namespace_beside_the_run_is_skipped_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file ``kubectl apply -f`` takes whole: a Namespace, then the run in it."""
    path = _write(tmp_path, "run.yaml", NAMESPACE + "---\n" + GOOD)
    assert main(["validate", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert f"{path}[0]: Namespace 'gagar' skipped: not a GagarRun" in captured.out
    assert f"{path}[1]: GagarRun 'ok' is valid" in captured.out
    assert load_run(path).metadata.name == "ok"  # gagar train and gagar render take it too
    # the run beside it is still validated, and a misspelt version of a run is no other object
    path = _write(tmp_path, "bad.yaml", NAMESPACE + "---\n" + BAD)
    assert main(["validate", str(path)]) == 1
    assert f"{path}[1]: spec.grader:" in capsys.readouterr().err
    wrong = GOOD.replace("v1alpha1", "v1beta1")
    path = _write(tmp_path, "wrong.yaml", NAMESPACE + "---\n" + wrong)
    assert main(["validate", str(path)]) == 1
    assert f"{path}[1]: not a GagarRun" in capsys.readouterr().err


def test_a_file_without_a_run_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "ns.yaml", NAMESPACE + "---\n" + NAMESPACE.replace("gagar", "b"))
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}: no GagarRun in the file: it holds Namespace 'gagar', Namespace 'b', not a "
        "GagarRun (gagar.dev/v1alpha1, GagarRun)"
    ]


def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_examples_validate_through_the_installed_command() -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    done = subprocess.run(
        [sys.executable, "-m", "gagar.cli", "validate", *examples],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("is valid") == len(examples)


def test_crd_prints_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "CustomResourceDefinition"


def test_crd_check_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--check", "--root", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert main(["crd", "--write", "--root", str(tmp_path)]) == 0
    assert main(["crd", "--check", "--root", str(tmp_path)]) == 0
