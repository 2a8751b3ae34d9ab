"""Every container the operator builds runs a command that exists, with arguments it accepts.

Each example manifest is rendered through ``gagar render`` (in process) with and without the
optional CRDs, and every container of every pod template is checked by the program it starts:

* ``gagar ...``: the real ``gagar`` parser (``gagar.cli.build_parser``) must accept the arguments;
  a server (``... serve``) must listen on every interface and on a port the container declares;
* ``python -m gagar.driver.launch``: torchrun's parser, and the worker's parser for its arguments;
* a vLLM server: vLLM's own ``vllm serve`` parser (``make_arg_parser``) and its argument checks, in
  ``.venv-vllm`` (skipped without it); the embedded server's command line goes through it too;
* anything else fails the test, so a new kind of container has to be checked here first.

argparse exits on an unknown flag; here that exit is a test failure naming the container.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.cli import build_parser, main
from gagar.operator.builders.config import config_data
from gagar.rollout.engines.server import DEFAULT_VENV, ServerConfig, server_command
from tests.unit.test_builders import ALL_CRDS, example

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.yaml"))
CONTEXTS = {"bare": (), "all-crds": tuple(sorted(ALL_CRDS))}
VLLM_PYTHON = DEFAULT_VENV / "bin" / "python"
MODEL = "/models/m"  # stands for the model path the entry script picks ("$M")


def rendered(example: str, crds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The objects ``gagar render examples/<example>.yaml [--with-crd ...]`` prints; none where
    the example asks for an integration the bare cluster lacks (it is Stalled, creates nothing)."""
    argv = ["render", str(ROOT / "examples" / f"{example}.yaml")]
    argv += [f"--with-crd={group}" for group in crds]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code != 0:
        assert not crds and "Stalled (" in err.getvalue(), err.getvalue()
        return []
    return list(yaml.safe_load_all(out.getvalue()))


def containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container (and init container) of every pod template anywhere in ``node``."""
    if isinstance(node, dict):
        for key in ("initContainers", "containers"):
            if isinstance(node.get(key), list):
                yield from node[key]
        for value in node.values():
            yield from containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from containers(value)


def _cases() -> list[Any]:
    cases = []
    for name in EXAMPLES:
        for ctx, crds in CONTEXTS.items():
            for obj in rendered(name, crds):
                for c in containers(obj):
                    where = f"{name}/{ctx}/{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
                    cases.append(pytest.param(c, id=where))
    return cases


CASES = _cases()


def argv_of(c: dict[str, Any]) -> list[str]:
    """The container's argv as the kubelet starts it: ``$(VAR)`` replaced by the container's env
    (a variable from ``valueFrom``, e.g. the Job's completion index, by ``0``)."""
    env = {e["name"]: e.get("value", "0") for e in c.get("env", [])}

    def expand(arg: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)

    return [expand(a) for a in [*c.get("command", []), *c.get("args", [])]]


def kind_of(argv: list[str]) -> str:
    if argv[:1] == ["gagar"] or argv[:3] in (
        ["python", "-m", "gagar"],
        ["python", "-m", "gagar.cli"],
    ):
        return "gagar"
    if argv[:3] == ["python", "-m", "gagar.driver.launch"]:
        return "launch"
    if argv[:2] == ["/bin/sh", "-c"] and "vllm serve" in argv[2]:
        return "vllm"
    return "unknown"


def parse(parser: argparse.ArgumentParser, args: list[str], where: str) -> argparse.Namespace:
    try:
        return parser.parse_args(args)
    except SystemExit as err:
        pytest.fail(f"{where}: `{shlex.join(args)}` is rejected by its parser (exit {err.code})")


def vllm_serve_args(c: dict[str, Any]) -> list[str]:
    """``vllm serve`` arguments of a vLLM container: its model, then the container's ``args``.

    The entry script execs ``vllm serve MODEL "$@"``: ``$0`` is the command's fourth element,
    the options are the container's ``args``."""
    script = c["command"][2]
    assert script.endswith('"$@"'), f"{c['name']}: the script drops its arguments: {script}"
    assert len(c["command"]) == 4, c["command"]
    return [MODEL, *c.get("args", [])]


@pytest.mark.parametrize("c", CASES)
def test_container_command_is_known(c: dict[str, Any]) -> None:
    assert kind_of(argv_of(c)) != "unknown", (
        f"{c['name']} runs {argv_of(c)[:3]}: teach tests/integration/test_pod_commands.py to parse it"
    )


@pytest.mark.parametrize("c", [p for p in CASES if kind_of(argv_of(p.values[0])) == "gagar"])
def test_gagar_commands_parse(c: dict[str, Any]) -> None:
    argv = argv_of(c)
    args = argv[1:] if argv[0] == "gagar" else argv[3:]
    ns = parse(build_parser(), args, c["name"])
    assert callable(ns.func)
    if args[1:2] == ["serve"]:  # a server in a pod: reachable from the other pods
        assert ns.host == "0.0.0.0", f"{c['name']} listens on {ns.host} only"
        declared = {p["containerPort"] for p in c["ports"]}
        assert ns.port in declared, f"{c['name']} listens on {ns.port}, declares {declared}"
        assert getattr(ns, "metrics_port", None) in (None, *declared)


@pytest.mark.parametrize("c", [p for p in CASES if kind_of(argv_of(p.values[0])) == "launch"])
def test_trainer_launch_parses(c: dict[str, Any]) -> None:
    """The launcher hands its arguments to torchrun; torchrun runs the worker module with the rest."""
    run = pytest.importorskip("torch.distributed.run")
    worker = importlib.import_module("gagar.driver.worker")
    launch = argv_of(c)[3:]
    try:
        ns = run.parse_args(launch)
    except SystemExit as err:
        pytest.fail(f"torchrun rejects `{shlex.join(launch)}` (exit {err.code})")
    assert ns.module and ns.training_script == "gagar.driver.worker"
    parse(worker.build_parser(), ns.training_script_args, c["name"])


def _vllm_parse(argvs: list[list[str]]) -> list[str | None]:
    """Parse each ``vllm serve`` argument list with vLLM's parser in ``.venv-vllm``: None when
    accepted, else why not."""
    code = (
        "import contextlib, io, json, sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args\n"
        "from vllm.entrypoints.launchers.launcher import validate_api_server_args\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "out = []\n"
        "for argv in json.load(sys.stdin):\n"
        "    err = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stderr(err):\n"
        "            args = make_arg_parser(FlexibleArgumentParser(prog='vllm serve')).parse_args(argv)\n"
        "        validate_parsed_serve_args(args)\n"
        "        validate_api_server_args(args)\n"
        "        out.append(None)\n"
        "    except SystemExit as e:\n"
        "        out.append(f'exit {e.code}: {err.getvalue().strip()[-800:]}')\n"
        "    except Exception as e:\n"
        "        out.append(f'{type(e).__name__}: {e}')\n"
        "print('RESULT ' + json.dumps(out))\n"
    )
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", code],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM's parser did not run:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM environment at {DEFAULT_VENV}")
def test_vllm_containers_and_embedded_server_parse_with_vllm() -> None:
    named = {
        p.id: vllm_serve_args(p.values[0]) for p in CASES if kind_of(argv_of(p.values[0])) == "vllm"
    }
    assert any(k.endswith("/vllm") for k in named) and any(k.endswith("/model") for k in named)
    embedded = server_command(ServerConfig(model=Path(MODEL), tool_call_parser="hermes"), "py", 1)
    named["embedded server"] = embedded[embedded.index("--model") :]
    results = _vllm_parse(list(named.values()))
    bad = {k: why for k, why in zip(named, results, strict=True) if why is not None}
    assert not bad, "vLLM rejects:\n" + "\n".join(
        f"{k}: {shlex.join(named[k])}\n  {v}" for k, v in bad.items()
    )


def test_rollout_pods_run_the_embedded_servers_rl_flags() -> None:
    """What the embedded server needs for RL, the rollout pods get too (one ``vllm_args``)."""
    embedded = server_command(ServerConfig(model=Path(MODEL)), "py", 1)
    for name in EXAMPLES:
        for obj in rendered(name, ()):
            for c in containers(obj):
                if c["name"] != "vllm":
                    continue
                args = c["args"]
                for flag in ("--logprobs-mode", "--max-logprobs", "--served-model-name"):
                    assert args[args.index(flag) + 1] == embedded[embedded.index(flag) + 1]
                assert "--weight-transfer-config" in args and "--dtype" in args


@pytest.mark.parametrize("name", EXAMPLES)
def test_grader_pod_reads_its_settings_from_the_config_dir(name: str, tmp_path: Path) -> None:
    """``gagar grader serve`` as the pod runs it, with the run's ConfigMap at its config dir."""
    from gagar.grader.cli import settle

    run = example(name)
    for key, text in config_data(run).items():
        (tmp_path / key).write_text(text)
    everything = tuple(sorted(ALL_CRDS))  # flash-moe's JobSet: rendered where the cluster has it
    graders = [
        c for obj in rendered(name, everything) for c in containers(obj) if c["name"] == "grader"
    ]
    if run.spec.grader.endpoint is not None:
        assert graders == []
        return
    (c,) = graders
    args = [a.replace("/etc/gagar/config", str(tmp_path)) for a in argv_of(c)[1:]]
    ns = settle(parse(build_parser(), args, c["name"]))
    g = run.spec.grader
    assert (ns.grader, ns.deadline, ns.fallback) == (g.kind, g.deadline_seconds, g.fallback)
    assert (ns.max_turns, ns.max_retries, ns.queue_size) == (
        g.max_turns,
        g.max_retries,
        g.queue_size,
    )
    assert ns.sandbox_limits == run.spec.sandbox.limits.executor_limits()
    if g.kind == "agentic":
        assert ns.model_url == "http://127.0.0.1:8000/v1" and ns.model == "grader"
        assert ns.sandbox == ("pool" if run.spec.sandbox.backend == "pods" else "bwrap")


def test_grader_flags_win_over_the_config_dir(tmp_path: Path) -> None:
    from gagar.grader.cli import settle

    for key, text in config_data(example("single-gpu")).items():
        (tmp_path / key).write_text(text)
    argv = ["grader", "serve", f"--config-dir={tmp_path}", "--deadline=5", "--grader=heuristic"]
    ns = settle(build_parser().parse_args(argv))
    assert (ns.deadline, ns.grader, ns.max_turns) == (5.0, "heuristic", 24)
    defaults = settle(build_parser().parse_args(["grader", "serve"]))
    # without a config dir: spec.grader's own defaults (one source for the service and the spec)
    assert (defaults.grader, defaults.deadline, defaults.queue_size) == ("heuristic", 600.0, 64)
    assert defaults.max_turns == 24
    with pytest.raises(SystemExit, match="is missing"):
        settle(build_parser().parse_args(["grader", "serve", f"--config-dir={tmp_path / 'x'}"]))
