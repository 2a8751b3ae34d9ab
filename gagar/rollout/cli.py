"""``gagar rollout serve``: run vLLM configured for RL on a policy folder; ``gagar rollout
fetch-weights``: a rollout pod's first step, the newest policy version fetched from the trainer.

Configured for RL means: float32 by default on CPU (exact log-probs for the importance ratio),
raw log-probs, the RL weight-update routes (``VLLM_SERVER_DEV_MODE=1``) and gagar's
``gagar_safetensors`` weight-transfer backend (``nccl`` on GPUs if asked). It stays in the
foreground until interrupted, and stops vLLM's whole process group on the way out.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path

# The flags named as ``ServerConfig``'s fields, passed through as they are.
SAME_NAMES = (
    "port", "host", "dtype", "max_model_len", "served_name", "weight_transfer_backend",
    "tool_call_parser",
)  # fmt: skip


def _config(args: argparse.Namespace):
    from gagar.rollout.engines.server import ServerConfig

    same = {name: getattr(args, name) for name in SAME_NAMES}
    extra = shlex.split(args.vllm_args or "")
    return ServerConfig(Path(args.model), enforce_eager=args.eager, extra_args=extra, **same)


def _serve(args: argparse.Namespace) -> int:
    from gagar.rollout.engines.server import VllmServer, VllmServerError, server_command

    if not Path(args.model).is_dir():
        print(f"gagar rollout serve: model folder {args.model} does not exist", file=sys.stderr)
        return 2
    server = VllmServer(_config(args), Path(args.log))
    if args.dry_run:
        print(shlex.join(server_command(server.cfg, server.python, server.port)))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below
    try:
        server.start(timeout=args.timeout)
        print(
            f"vLLM serving {args.model} at {server.base_url} (log: {args.log}, "
            f"started in {server.startup_seconds:.0f}s); {_token_hint(Path(args.log))}",
            flush=True,
        )
        return server.proc.wait() if server.proc else 1
    except VllmServerError as e:
        print(f"gagar rollout serve: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


def _token_hint(log: Path) -> str:
    """Where a trainer finds the token the weight-update routes require: the caller's
    ``$GAGAR_WEIGHT_SYNC_TOKEN``, else this process's random one, written beside the log
    (owner-only) rather than printed."""
    from gagar.rollout.engines.vllm_auth import TOKEN_ENV, control_token

    if os.environ.get(TOKEN_ENV):
        return f"weight updates take ${TOKEN_ENV}"
    file = log.with_name(log.name + ".token")
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(control_token())
    return f"weight updates take the token in {file} (set ${TOKEN_ENV} to it)"


def _fetch_weights(args: argparse.Namespace) -> int:
    """The rollout pod's init container: ``--dest`` holds the newest published policy version
    afterwards, or stays absent when the replica boots from ``--base-model``."""
    import logging

    from gagar.rollout.engines.vllm_auth import TOKEN_ENV
    from gagar.rollout.engines.weight_http import FetchError, boot_weights

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    token = os.environ.get(TOKEN_ENV)
    if not token:
        print(f"gagar rollout fetch-weights: ${TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    try:
        got = boot_weights(
            args.url, Path(args.dest), token, args.base_model or None, args.wait_seconds
        )
    except FetchError as e:
        print(f"gagar rollout fetch-weights: {e}", file=sys.stderr)
        return 1
    print(f"booting from {got or args.base_model}", flush=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    rollout = sub.add_parser("rollout", help="rollout engine: serve a policy with vLLM")
    rsub = rollout.add_subparsers(dest="rollout_command", required=True, metavar="COMMAND")
    p = rsub.add_parser("serve", help="start vLLM configured for RL on a HF policy folder")
    p.add_argument("--model", required=True, help="HF folder (config, safetensors, tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--served-name", default="policy")
    p.add_argument(
        "--weight-transfer-backend",
        default="gagar_safetensors",
        help="gagar_safetensors (CPU or GPU, shared volume) or a vLLM one: nccl, ...",
    )
    p.add_argument("--tool-call-parser", default=None, help="e.g. hermes (enables tool choice)")
    p.add_argument("--eager", action="store_true", help="skip torch.compile (faster start)")
    p.add_argument("--vllm-args", default="", help="extra vLLM arguments, one quoted string")
    p.add_argument("--log", default="runs/vllm.log", help="where vLLM's output goes")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for readiness")
    p.add_argument("--dry-run", action="store_true", help="print the vLLM command and exit")
    p.set_defaults(func=_serve)
    f = rsub.add_parser(
        "fetch-weights", help="fetch the newest policy version the trainer serves (a pod's init)"
    )
    f.add_argument("--url", required=True, help="the trainer's weight server")
    f.add_argument("--dest", required=True, help="the folder the version is written to")
    f.add_argument("--base-model", default="", help="boot from it when nothing is published")
    f.add_argument(
        "--wait-seconds",
        type=float,
        default=120.0,
        help="how long an unreachable trainer is waited for before the base model",
    )
    f.set_defaults(func=_fetch_weights)
