"""``gagar sandbox exec|serve|check``: run one jailed command, serve sessions over HTTP, check setup."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gagar.sandbox.local import LocalFactory

NO_UID_WARNING = (
    "WARNING: the executor is not root, so pod-mode sessions share its uid: run one session "
    "per pod (a root executor with CAP_SETUID/CAP_SETGID gives each session a uid of its own)"
)


def _factory(
    args: argparse.Namespace, root: str | None = None, **limit_overrides: object
) -> LocalFactory:
    from gagar.sandbox import isolation
    from gagar.sandbox.local import LocalFactory
    from gagar.sandbox.types import Limits

    limits = Limits.model_validate({k: v for k, v in limit_overrides.items() if v is not None})
    if args.unsafe_no_isolation:
        return LocalFactory(limits=limits, isolation="none", root=root)
    factory, choice = isolation.factory(args.isolation, limits, root)
    if args.sandbox_command == "serve" or choice.mode != "bubblewrap":
        print(f"gagar sandbox: {choice.why}", file=sys.stderr, flush=True)
    if choice.mode == "pod" and os.geteuid() != 0:
        print(f"gagar sandbox: {NO_UID_WARNING}", file=sys.stderr, flush=True)
    return factory


def _read_dir(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        raise SystemExit(f"gagar sandbox: --workspace {root} is not a directory")
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _exec(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gagar.sandbox.types import SandboxError

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print(
            "gagar sandbox exec: no command given (gagar sandbox exec -- CMD ...)", file=sys.stderr
        )
        return 2
    try:
        factory = _factory(args, wall_time_s=args.timeout, memory_bytes=args.memory)
        files = _read_dir(Path(args.workspace)) if args.workspace else {}
        with factory.create(files=files) as session:
            result = session.exec(cmd)
    except ValidationError as e:
        problems = "; ".join(f"{x['loc'][0]}: {x['msg']}" for x in e.errors())
        print(f"gagar sandbox exec: bad limits: {problems}", file=sys.stderr)
        return 2
    except SandboxError as e:
        print(f"gagar sandbox: {e}", file=sys.stderr)
        return 3
    print(json.dumps(result.model_dump()))
    return 0 if result.infra_error is None else 3


def _serve(args: argparse.Namespace) -> int:
    from gagar import auth
    from gagar.sandbox.server import Server, ServerConfig
    from gagar.sandbox.types import SandboxError

    root = args.workspace_root
    if root is not None and not Path(root).is_dir():
        print(f"gagar sandbox: --workspace-root {root} is not a directory", file=sys.stderr)
        return 2
    try:
        token = auth.token()
        factory = _factory(args, root=root)
        config = ServerConfig(
            host=args.host,
            port=args.port,
            max_sessions=args.max_sessions,
            idle_timeout_s=args.idle_timeout,
            token=token,
        )
        server = Server(factory, config, labels={"run": args.run, "pool": args.pool})
    except (RuntimeError, OSError) as e:
        print(f"gagar sandbox: {e}", file=sys.stderr)
        return 2
    except SandboxError as e:
        print(f"gagar sandbox: {e}", file=sys.stderr)
        return 3
    print(f"gagar sandbox: authentication {'by token' if token else 'off'}", file=sys.stderr)
    if args.metrics_port is not None and args.metrics_port != args.port:
        from prometheus_client import start_http_server

        start_http_server(
            args.metrics_port, addr=args.host, registry=server.registry.metrics.registry
        )
    print(f"gagar sandbox serving on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()  # until SIGTERM or SIGINT: then every session is closed
    finally:
        server.server_close()
    return 0


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        return value

    return parse


def _check(args: argparse.Namespace) -> int:
    from gagar.sandbox import isolation
    from gagar.sandbox.types import SandboxError

    try:
        choice = isolation.choose(args.isolation)
    except SandboxError as e:
        print(f"gagar sandbox: {e}", file=sys.stderr)
        return 3
    if choice.mode != "bubblewrap":
        print(f"gagar sandbox: {choice.why}", file=sys.stderr)
    print(f"sandbox isolation available ({choice.mode})")
    return 0


def _isolation_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--isolation",
        choices=("auto", "bubblewrap", "pod"),
        default="auto",
        help="bubblewrap: namespaces per command; pod: the pod is the boundary (no namespaces); "
        "auto: bubblewrap where it works, else pod (default)",
    )


def _unsafe_flag(p: argparse.ArgumentParser) -> None:
    _isolation_flag(p)
    p.add_argument(
        "--unsafe-no-isolation",
        action="store_true",
        help="DEVELOPMENT ONLY: run commands without any isolation (only rlimits)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    sandbox = sub.add_parser("sandbox", help="isolated execution of untrusted code")
    ssub = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    p = ssub.add_parser("exec", help="run one command in a fresh sandbox; print the result as JSON")
    p.add_argument(
        "--timeout", type=_positive(float), default=None, help="wall-clock limit in seconds"
    )
    p.add_argument("--memory", type=_positive(int), default=None, help="memory limit in bytes")
    p.add_argument("--workspace", default=None, help="directory copied into the workspace")
    _unsafe_flag(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    p.set_defaults(func=_exec)
    s = ssub.add_parser("serve", help="serve sandbox sessions over HTTP (for sandbox pods)")
    s.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a sandbox pod)"
    )
    s.add_argument("--port", type=int, default=8700)
    s.add_argument("--max-sessions", type=_positive(int), default=64)
    s.add_argument(
        "--idle-timeout",
        type=_positive(float),
        default=1800.0,
        help="close a session unused for this many seconds (its client vanished)",
    )
    s.add_argument(
        "--metrics-port",
        type=int,
        help="also serve /metrics on this port (the pod's metrics port); /metrics is on --port too",
    )
    s.add_argument("--run", help="run label of the metrics (default: $GAGAR_RUN)")
    s.add_argument("--pool", help="pool label of the metrics (default: $GAGAR_COMPONENT, sandbox)")
    s.add_argument(
        "--workspace-root",
        default=None,
        help="directory holding the sessions' workspaces (a sandbox pod's writable volume; "
        "default: the temp dir)",
    )
    _unsafe_flag(s)
    s.set_defaults(func=_serve)
    c = ssub.add_parser("check", help="check that isolation works on this machine")
    _isolation_flag(c)
    c.set_defaults(func=_check)
