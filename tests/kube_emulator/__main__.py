"""Serve the emulator as a process of its own, reachable only through the kubeconfigs it writes.

    python -m tests.kube_emulator DIR [--service-account NS/NAME ...]
    python -m tests.kube_emulator DIR --dev [--port PORT]

writes ``DIR/admin.kubeconfig`` (the cluster admin), one ``DIR/<ns>.<name>.kubeconfig`` per
``--service-account`` (requests as that ServiceAccount, so RBAC applies), then ``DIR/ready``, and
serves until stdin closes or SIGTERM arrives. Tests use it for the code path a real cluster
takes: nothing but a kubeconfig connects them.

``--dev`` (``make dev-cluster``) is a cluster to try gagar on instead: the CRD, the operator,
``DIR/kubeconfig`` for kubectl and helm over HTTPS on ``--port`` (:mod:`.dev`), until Ctrl-C.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import threading

from .emulator import KubeEmulator


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.kube_emulator")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--service-account", action="append", default=[], metavar="NS/NAME")
    p.add_argument("--bookmark-interval", type=float, default=0.5)
    p.add_argument("--deployment-delay", type=float, default=0.05)
    p.add_argument("--openapi-validate", action="store_true")
    p.add_argument("--dev", action="store_true", help="a cluster to try gagar on (see dev.py)")
    p.add_argument("--port", type=int, default=0, help="--dev: the HTTPS port (0: a free one)")
    args = p.parse_args(argv)
    if args.dev:
        from . import dev

        return dev.main(args.dir, args.port)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    emulator = KubeEmulator(
        bookmark_interval=args.bookmark_interval,
        deployment_delay=args.deployment_delay,
        openapi_validate=args.openapi_validate,
    )
    with emulator:
        emulator.write_kubeconfig(args.dir / "admin.kubeconfig")
        for account in args.service_account:
            ns, _, name = account.partition("/")
            source = emulator.service_account_kubeconfig(ns, name)
            (args.dir / f"{ns}.{name}.kubeconfig").write_text(source.read_text())
        (args.dir / "ready").write_text(emulator.url)
        done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
