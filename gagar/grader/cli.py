"""``gagar grader serve``, ``gagar grader sample DIR`` and ``gagar grader grade PATH`` (alias
``gagar grade PATH``).

Which grader runs is chosen here (``--grader heuristic|agentic``). The agentic grader's tools
run in a sandbox session: ``bwrap`` (a ``gagar.sandbox`` local session, through
``sandbox_adapter``; needs the sandbox package), ``pool`` (the run's sandbox pods behind
``--sandbox-url``), ``agent-sandbox`` (a Sandbox claimed per session from
``--sandbox-warmpool`` in ``$GAGAR_NAMESPACE``) or ``unsafe-local`` (NOT isolated, development only).

In a grader pod, ``gagar grader serve --config-dir=DIR`` takes its settings from the run's
``spec.grader`` in ``DIR/run.json`` (the operator's ConfigMap): kind, deadline, fallback, turns,
retries, queue size (and the model endpoint, if the spec names one). A flag given on the command
line wins over the config dir; both win over the built-in defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gagar import RUN_FILE
from gagar.grader.protocol import Grader, SandboxFactory
from gagar.spec import GRADER_SERVED_NAME, GraderSpec

if TYPE_CHECKING:
    from gagar.spec import GagarRun

SANDBOXES = ("bwrap", "pool", "agent-sandbox", "unsafe-local")
_SPEC = (
    GraderSpec.model_construct()
)  # spec.grader's defaults (unvalidated: no pool size) are the service's
# The settings a run's config dir can give, with their built-in values (``None`` flags take them).
DEFAULTS: dict[str, Any] = {
    "grader": _SPEC.kind,
    "deadline": _SPEC.deadline_seconds,
    "max_turns": _SPEC.max_turns,
    "max_retries": _SPEC.max_retries,
    "fallback": _SPEC.fallback,
    "queue_size": _SPEC.queue_size,
}


def _executor_limits(limits: dict[str, Any] | None) -> Any:
    """``gagar.sandbox.types.Limits`` of the run's ``spec.sandbox.limits`` (None: the backend's)."""
    from gagar.sandbox.types import Limits

    return Limits(**limits) if limits else None


def _bwrap_factory(limits: dict[str, Any] | None = None) -> SandboxFactory:
    from gagar.grader.sandbox_adapter import adapt_factory

    try:
        from gagar.sandbox.local import LocalFactory
        from gagar.sandbox.types import SandboxError
    except ImportError as err:
        raise SystemExit(f"the bubblewrap sandbox backend is not available: {err}") from None
    return adapt_factory(LocalFactory(_executor_limits(limits)), refused=(SandboxError,))


def _pool_factory(
    url: str | None, limits: dict[str, Any] | None = None, config_dir: Path | None = None
) -> SandboxFactory:
    """The run's executor pools: ``url``'s, and each task environment's and task image's that
    the run's config names (``sandbox-pools.json``, read again for an image's new pool): a
    task's tests run in its environment's pool."""
    from gagar.grader.sandbox_adapter import adapt_factory

    if not url:
        raise SystemExit("--sandbox pool needs --sandbox-url (the run's sandbox Service)")
    try:
        from gagar.sandbox.routing import pool_factory, read_pools
        from gagar.sandbox.types import SandboxError
    except ImportError as err:
        raise SystemExit(f"the sandbox pool client is not available: {err}") from None
    try:
        pools = read_pools(config_dir) if config_dir is not None else {}
    except SandboxError as err:
        raise SystemExit(str(err)) from None
    factory = pool_factory(url, pools, _executor_limits(limits), config_dir=config_dir)
    return adapt_factory(factory)


def _claim_factory(warmpool: str | None, limits: dict[str, Any] | None = None) -> SandboxFactory:
    from gagar.grader.sandbox_adapter import adapt_factory

    if not warmpool:
        raise SystemExit("--sandbox agent-sandbox needs --sandbox-warmpool (the run's warm pool)")
    from gagar import env
    from gagar.sandbox.agent import AgentSandboxFactory

    namespace = os.environ.get(env.NAMESPACE) or "default"
    return adapt_factory(
        AgentSandboxFactory(
            warmpool, namespace, limits=_executor_limits(limits), run=os.environ.get(env.RUN)
        )
    )


def _sandbox_factory(args: argparse.Namespace) -> SandboxFactory:
    name = args.sandbox
    if name is None:
        raise SystemExit(
            "the agentic grader runs tools in a sandbox: pass --sandbox "
            f"({', '.join(SANDBOXES)}); 'unsafe-local' is NOT isolated (development only)"
        )
    limits = getattr(args, "sandbox_limits", None)  # spec.sandbox.limits, from --config-dir
    if name == "bwrap":
        return _bwrap_factory(limits)
    if name == "pool":
        config_dir = getattr(args, "config_dir", None)
        return _pool_factory(args.sandbox_url, limits, Path(config_dir) if config_dir else None)
    if name == "agent-sandbox":
        return _claim_factory(args.sandbox_warmpool, limits)
    from gagar.grader.local_sandbox import unsafe_local_factory

    print("WARNING: --sandbox unsafe-local runs candidate code WITHOUT isolation", file=sys.stderr)
    return unsafe_local_factory


def build_grader(args: argparse.Namespace) -> Grader:
    """The grader named by the command-line options."""
    from gagar.grader.protocol import HeuristicGrader

    settle(args)
    if args.grader == "heuristic":
        return HeuristicGrader()
    from gagar.grader.agentic import AgenticConfig, AgenticGrader

    if not args.model_url or not args.model:
        raise SystemExit("--grader agentic needs --model-url and --model")
    config = AgenticConfig(
        base_url=args.model_url,
        model=args.model,
        api_key=os.environ.get(args.api_key_env, "EMPTY"),
        deadline_seconds=args.deadline,
        max_turns=args.max_turns,
        max_retries=args.max_retries,
        fallback=args.fallback,
    )
    return AgenticGrader(config, _sandbox_factory(args))


def load_run(config_dir: Path) -> GagarRun:
    """The GagarRun in ``config_dir/run.json``, validated again (a clear exit if unusable)."""
    from gagar.manifest import ConfigError, load_config_dir

    try:
        return load_config_dir(config_dir)
    except ConfigError as err:
        raise SystemExit(str(err)) from None


def settings(run: GagarRun) -> dict[str, Any]:
    """The run's ``spec.grader`` as ``gagar grader serve`` settings (``DEFAULTS``' keys)."""
    g = run.spec.grader
    found: dict[str, Any] = {
        "grader": g.kind,
        "deadline": g.deadline_seconds,
        "max_turns": g.max_turns,
        "max_retries": g.max_retries,
        "fallback": g.fallback,
        "queue_size": g.queue_size,
        "sandbox_limits": run.spec.sandbox.limits.executor_limits(),
    }
    if g.endpoint:  # an external model server (as ``gagar train`` uses it)
        found |= {"model_url": g.endpoint, "model": g.model or GRADER_SERVED_NAME}
    return found


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the settings not given as flags: from ``--config-dir`` if given, else ``DEFAULTS``."""
    config_dir = getattr(args, "config_dir", None)
    found = settings(load_run(Path(config_dir))) if config_dir else {}
    for key, value in {**DEFAULTS, **found}.items():
        if hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _grader_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grader", choices=["heuristic", "agentic"], help=f"default: {DEFAULTS['grader']}"
    )
    p.add_argument(
        "--model-url",
        help="OpenAI-compatible base URL of the grader model, e.g. http://host:8000/v1",
    )
    p.add_argument("--model", help="model name served there")
    p.add_argument(
        "--api-key-env",
        default="GAGAR_GRADER_API_KEY",
        help="environment variable holding the API key",
    )
    p.add_argument(
        "--deadline",
        type=float,
        help=f"per-group deadline in seconds (default {DEFAULTS['deadline']:g})",
    )
    p.add_argument("--max-turns", type=int, help=f"default: {DEFAULTS['max_turns']}")
    p.add_argument(
        "--max-retries",
        type=int,
        help=f"malformed answers fed back before falling back (default {DEFAULTS['max_retries']})",
    )
    p.add_argument(
        "--fallback", choices=["heuristic", "unusable"], help=f"default: {DEFAULTS['fallback']}"
    )
    p.add_argument(
        "--sandbox", choices=sorted(SANDBOXES), help="where the agentic grader's tools run"
    )
    p.add_argument("--sandbox-url", help="the sandbox pool's Service URL (--sandbox pool)")
    p.add_argument(
        "--sandbox-warmpool",
        help="the SandboxWarmPool sessions claim from (--sandbox agent-sandbox)",
    )


def _serve(args: argparse.Namespace) -> int:
    from gagar import auth
    from gagar.grader.service import GraderService, ServiceConfig, serve

    settle(args)
    try:
        token = auth.token()
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    flags = (
        "host",
        "port",
        "queue_size",
        "workers",
        "drain_seconds",
        "metrics_port",
        "run",
        "pool",
    )
    cfg = ServiceConfig(token=token, **{name: getattr(args, name) for name in flags})
    serve(GraderService(build_grader(args), cfg))
    return 0


def _grade(args: argparse.Namespace) -> int:
    from gagar.grader.workspace import load_group

    try:
        group = load_group(Path(args.path))
    except (OSError, ValueError, KeyError) as err:
        print(f"error: cannot load a grading group from {args.path}: {err}", file=sys.stderr)
        return 2
    if args.url:
        from gagar.grader.service import GraderClient, GraderUnavailable

        try:
            ranking = GraderClient(args.url).grade_sync(group)
        except GraderUnavailable as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    else:
        ranking = asyncio.run(build_grader(args).grade(group))
    print(ranking.model_dump_json(indent=2))
    return 0


def _sample(args: argparse.Namespace) -> int:
    from gagar.grader.sample import sample_group
    from gagar.grader.workspace import write_workspace

    root = write_workspace(sample_group(), Path(args.dir))
    print(f"wrote the sample group's workspace to {root}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    grader = sub.add_parser("grader", help="grader service and tools (serve, sample, grade, ...)")
    gsub = grader.add_subparsers(dest="grader_command", required=True, metavar="COMMAND")
    serve = gsub.add_parser("serve", help="serve POST /v1/grade, /healthz, /metrics")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a grader pod)"
    )
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--metrics-port",
        type=int,
        help="also serve /metrics on this port (the pod's metrics port); /metrics is on --port too",
    )
    serve.add_argument(
        "--config-dir",
        help=f"the run's config (its {RUN_FILE}, the operator's ConfigMap): spec.grader's settings",
    )
    serve.add_argument(
        "--queue-size",
        type=int,
        help=f"waiting groups before 429 (default {DEFAULTS['queue_size']})",
    )
    serve.add_argument("--workers", type=int, default=2, help="groups graded concurrently")
    serve.add_argument("--run", help="run label of the metrics (default: $GAGAR_RUN)")
    serve.add_argument(
        "--pool", help="pool label of the metrics (default: $GAGAR_COMPONENT, grader)"
    )
    serve.add_argument(
        "--drain-seconds", type=float, default=30.0, help="time to finish work on shutdown"
    )
    _grader_options(serve)
    serve.set_defaults(func=_serve, sandbox_limits=None)
    sample = gsub.add_parser("sample", help="write the prepared sample group as a workspace")
    sample.add_argument("dir")
    sample.set_defaults(func=_sample)
    what = "grade a group (workspace directory or JSON file), print the ranking JSON"
    # `gagar grader grade` is the command; the top-level `gagar grade` it was first is kept as
    # an alias (scripts and images call it) and says so in `gagar --help`
    for parsers, name, help_text in (
        (gsub, "grade", what),
        (sub, "grade", "the same as `gagar grader grade` (an alias kept for scripts): " + what),
    ):
        grade = parsers.add_parser(name, help=help_text, description=what)
        grade.add_argument("path")
        grade.add_argument(
            "--url", help="grade through a running grader service instead of in process"
        )
        _grader_options(grade)
        grade.set_defaults(func=_grade)
