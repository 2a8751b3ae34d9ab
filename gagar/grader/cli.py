"""``gagar grader serve``, ``gagar grader sample DIR`` and ``gagar grade PATH``.

Which grader runs is chosen here (``--grader heuristic|agentic``). The agentic grader's tools
run in a sandbox session: ``bwrap`` (a ``gagar.sandbox`` local session, through
``sandbox_adapter``; needs the sandbox package) or ``unsafe-local`` (NOT isolated, development
only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from gagar.grader.protocol import Grader, SandboxFactory

SANDBOXES = ("bwrap", "unsafe-local")


def _bwrap_factory() -> SandboxFactory:
    from gagar.grader.sandbox_adapter import adapt_factory

    try:
        from gagar.sandbox.local import LocalFactory
        from gagar.sandbox.types import SandboxError
    except ImportError as err:
        raise SystemExit(f"the bubblewrap sandbox backend is not available: {err}") from None
    return adapt_factory(LocalFactory(), refused=(SandboxError,))


def _sandbox_factory(name: str | None) -> SandboxFactory:
    if name is None:
        raise SystemExit(
            "the agentic grader runs tools in a sandbox: pass --sandbox "
            f"({', '.join(SANDBOXES)}); 'unsafe-local' is NOT isolated (development only)"
        )
    if name == "bwrap":
        return _bwrap_factory()
    from gagar.grader.local_sandbox import unsafe_local_factory

    print("WARNING: --sandbox unsafe-local runs candidate code WITHOUT isolation", file=sys.stderr)
    return unsafe_local_factory


def build_grader(args: argparse.Namespace) -> Grader:
    """The grader named by the command-line options."""
    from gagar.grader.protocol import HeuristicGrader

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
    return AgenticGrader(config, _sandbox_factory(args.sandbox))


def _grader_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grader", choices=["heuristic", "agentic"], default="heuristic")
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
    p.add_argument("--deadline", type=float, default=300.0, help="per-group deadline in seconds")
    p.add_argument("--max-turns", type=int, default=30)
    p.add_argument(
        "--max-retries", type=int, default=2, help="malformed answers fed back before falling back"
    )
    p.add_argument("--fallback", choices=["heuristic", "unusable"], default="heuristic")
    p.add_argument(
        "--sandbox", choices=sorted(SANDBOXES), help="where the agentic grader's tools run"
    )


def _serve(args: argparse.Namespace) -> int:
    from gagar.grader.service import GraderService, ServiceConfig, serve

    cfg = ServiceConfig(
        host=args.host,
        port=args.port,
        queue_size=args.queue_size,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
    )
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
    grader = sub.add_parser("grader", help="grader service and tools")
    gsub = grader.add_subparsers(dest="grader_command", required=True, metavar="COMMAND")
    serve = gsub.add_parser("serve", help="serve POST /v1/grade, /healthz, /metrics")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--queue-size", type=int, default=64, help="waiting groups before 429")
    serve.add_argument("--workers", type=int, default=2, help="groups graded concurrently")
    serve.add_argument(
        "--drain-seconds", type=float, default=30.0, help="time to finish work on shutdown"
    )
    _grader_options(serve)
    serve.set_defaults(func=_serve)
    sample = gsub.add_parser("sample", help="write the prepared sample group as a workspace")
    sample.add_argument("dir")
    sample.set_defaults(func=_sample)
    grade = sub.add_parser(
        "grade", help="grade a group (workspace directory or JSON file), print the ranking JSON"
    )
    grade.add_argument("path")
    grade.add_argument("--url", help="grade through a running grader service instead of in process")
    _grader_options(grade)
    grade.set_defaults(func=_grade)
