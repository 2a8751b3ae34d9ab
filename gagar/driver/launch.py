"""The trainer pod's entry point: torchrun's launcher, keeping gagar's permanent exit code.

``python -m gagar.driver.launch [torchrun options] -m gagar.driver.worker --config-dir=DIR``
takes torchrun's own arguments (the trainer Job's container runs exactly that).

Why not ``torchrun`` itself: torchrun exits 1 whatever its workers exit with, and the Job's pod
failure policy fails the run at once only on ``GAGAR_EXIT_PERMANENT``. So this launcher first
checks the configuration (an invalid GagarRun exits with ``GAGAR_EXIT_PERMANENT`` before any
worker starts), then runs torchrun's launcher in this process and exits with
``GAGAR_EXIT_PERMANENT`` when any worker did (torchrun stops the other workers of a failed group
itself), 1 for any other failure, 0 when every worker finished. A worker that gives up also
leaves a marker file (``GAGAR_PERMANENT_MARKER``, set here): when that rank's exit broke a peer's
collective, torchrun may see the peer fail first and stop the rank before its exit code is in.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from gagar.driver.cluster import (
    PERMANENT_MARKER,
    exit_permanent,
    resolve,
)
from gagar.manifest import ConfigError
from gagar.manifest import load_config_dir as load_config

log = logging.getLogger("gagar.launch")


def config_dir(argv: list[str]) -> Path | None:
    """The worker's ``--config-dir`` among the launcher's arguments, if given."""
    for i, arg in enumerate(argv):
        if arg.startswith("--config-dir="):
            return Path(arg.split("=", 1)[1])
        if arg == "--config-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
    return None


def exit_code(worker_codes: list[int], permanent: int, marked: bool = False) -> int:
    """The pod's exit code from its failed workers' codes (and whether one left the marker)."""
    return permanent if marked or permanent in worker_codes else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(format="%(asctime)s launch %(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    permanent = exit_permanent()
    where = config_dir(argv)
    if where is not None:
        try:
            resolve(os.environ, load_config(where), where)
        except ConfigError as err:
            log.error("invalid configuration (exit %d, not retried): %s", permanent, err)
            return permanent
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    marker = Path(tempfile.mkdtemp(prefix="gagar-launch-")) / "permanent"
    os.environ[PERMANENT_MARKER] = str(marker)  # the workers inherit it
    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        code = exit_code(codes, permanent, marker.exists())
        reason = f" ({marker.read_text()})" if marker.exists() else ""
        log.error("trainer workers failed with exit codes %s%s: exit %d", codes, reason, code)
        return code
    finally:
        shutil.rmtree(marker.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
