"""What a newcomer meets first: `gagar --help`, `grade` beside `grader`, Ctrl-C, the operator's
metrics port beside `gagar train`'s, and `make help` (issue 49's papercuts)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gagar.chart_values import OperatorValues
from gagar.cli import build_parser, main
from gagar.spec import ObservabilitySpec

ROOT = Path(__file__).resolve().parents[2]


def _subcommands(parser) -> dict:
    return next(a for a in parser._actions if a.dest == "command").choices


def test_gagar_help_speaks_to_users_not_developers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "gagar train" in out and "GagarRun" in out
    assert "``" not in out and "register" not in out and "subcommands" not in out


def test_grade_is_the_grader_s_command_and_the_top_level_one_an_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    grader = _subcommands(parser)["grader"]
    nested = next(a for a in grader._actions if a.dest == "grader_command").choices
    assert "grade" in nested
    alias = parser.parse_args(["grade", "ws", "--grader", "heuristic"])
    canonical = parser.parse_args(["grader", "grade", "ws", "--grader", "heuristic"])
    assert alias.func is canonical.func and alias.path == canonical.path == "ws"
    assert alias.grader == canonical.grader == "heuristic"
    with pytest.raises(SystemExit):
        main(["--help"])
    entry = re.search(r"^ {4}grade +(.*?)^ {4}\w", capsys.readouterr().out, re.M | re.S)
    assert entry and "gagar grader grade" in " ".join(entry.group(1).split())


def test_ctrl_c_is_one_line_and_status_130(tmp_path: Path) -> None:
    """A real SIGINT to a command blocked in a read (``gagar validate`` of a FIFO)."""
    fifo = tmp_path / "run.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "validate", str(fifo)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal starts it: a suite run in the background (`make test &`) ignores SIGINT,
        # children inherit that, and Python then installs no KeyboardInterrupt handler at all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while True:  # the command has opened the FIFO once a writer can open it
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    try:
        time.sleep(0.2)  # into the read, which waits for the writer's data
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(writer)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["gagar validate: interrupted"]


def test_the_operator_s_metrics_port_is_not_the_one_gagar_train_serves_on() -> None:
    from gagar.operator.cli import OPERATOR_METRICS_PORT

    parser = build_parser()
    args = parser.parse_args(["operator"])
    chart = OperatorValues().metrics_port
    assert args.metrics_port == chart == OPERATOR_METRICS_PORT
    assert args.metrics_port != ObservabilitySpec().metrics_port
    local = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
    assert args.metrics_port != local["spec"]["observability"]["metricsPort"]
    values = yaml.safe_load((ROOT / "charts" / "gagar" / "values.yaml").read_text())
    assert values["operator"]["metricsPort"] == chart


def test_make_help_lists_every_target_with_its_values() -> None:
    makefile = (ROOT / "Makefile").read_text()
    documented = re.findall(r"^([a-zA-Z0-9_-]+):[^#=]*## ", makefile, re.MULTILINE)
    done = subprocess.run(
        ["make", "--no-print-directory", "help", "PROBE=17"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    plain = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    listed = [line.split()[0] for line in plain.splitlines() if line.strip()]
    assert listed == documented and "test-e2e" in listed
    assert "$(" not in plain
    assert "probe set of 17 samples" in plain


def test_make_grader_sft_writes_the_grader_the_agentic_example_serves() -> None:
    """`make grader-sft`'s commands parse with gagar's own CLI (a renamed flag fails here, not
    25 minutes into a run), and write the folder examples/local-grader.yaml serves."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^grader-sft:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "no `grader-sft` target"
    folder = re.search(r"^GRADER_SFT \?= (\S+)$", makefile, re.M)
    assert folder is not None
    lines = recipe.group(1).replace("\\\n", " ").splitlines()
    parser = build_parser()
    outs = []
    for line in lines:
        argv = line.replace("$(GRADER_SFT)", folder.group(1)).split()
        assert argv[0] == "gagar", line
        args = parser.parse_args(argv[1:])
        outs.append(args.out)
    assert [a.split()[2] for a in lines] == ["sft-data", "sft"]
    assert outs[1] == folder.group(1)
    example = yaml.safe_load((ROOT / "examples" / "local-grader.yaml").read_text())
    assert example["spec"]["grader"]["kind"] == "agentic"
    assert example["spec"]["grader"]["model"] == folder.group(1)
    assert example["spec"]["algorithm"]["totalSteps"] >= 3
