"""A package's test suite run in a sandbox session, with per-test outcomes and covered lines.

The probe (``probe.py``) is written into the workspace under ``.gagar_mine/`` and loaded with
``-p``: the package's tests run in the sandbox as any candidate's would, and what they report
(outcomes, the lines they executed) is data, read back from the workspace. It decides which
edits are tried and which tests a task lists; every kept task is then verified again by the
real verifier (``verify.verify_files``), which trusts nothing the workspace writes.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gagar.rollout.envs.mine import probe
from gagar.sandbox import SandboxError, Session

PROBE_DIR = ".gagar_mine"
PROBE_SOURCE = Path(probe.__file__).read_text()
COLLECT = probe.COLLECT


@dataclass(frozen=True)
class SuiteRun:
    """One run: outcomes per node id, first error lines, covered lines per node id."""

    outcomes: dict[str, str]
    messages: dict[str, str] = field(default_factory=dict)
    lines: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    collect_errors: int = 0
    duration_s: float = 0.0
    cpu_s: float = 0.0
    timed_out: bool = False

    @property
    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == "passed"}


class Suite:
    """Runs ``test_command`` (a pytest invocation) in ``session`` with the probe loaded."""

    def __init__(self, session: Session, test_command: str, timeout_s: float) -> None:
        self.session, self.test_command, self.timeout_s = session, test_command, timeout_s
        session.write_file(f"{PROBE_DIR}/gagar_mine_probe.py", PROBE_SOURCE.encode())

    def run(
        self, trace: bool = False, select: list[str] | None = None, timeout_s: float | None = None
    ) -> SuiteRun:
        env = [f"GAGAR_MINE_OUT={PROBE_DIR}/out.json", f"PYTHONPATH={PROBE_DIR}"]
        env.append(f"GAGAR_MINE_TRACE={int(trace)}")
        if select is not None:
            self.session.write_file(f"{PROBE_DIR}/select.txt", "\n".join(select).encode())
            env.append(f"GAGAR_MINE_SELECT={PROBE_DIR}/select.txt")
        args = "--rootdir=. -p gagar_mine_probe"
        if select is not None:  # collect only the selected tests' files, not the whole suite
            args += "".join(
                f" {shlex.quote(f)}" for f in sorted({t.split("::")[0] for t in select})
            )
        result = self.session.exec(
            f"{' '.join(env)} {self.test_command} {args}", timeout_s or self.timeout_s
        )
        try:
            raw = json.loads(self.session.read_file(f"{PROBE_DIR}/out.json"))
            self.session.delete_file(f"{PROBE_DIR}/out.json")
        except (SandboxError, ValueError):
            tail = (result.stdout + result.stderr)[-400:]
            stopped = result.timed_out or result.limit_hit is not None
            return SuiteRun({}, {"<run>": tail}, timed_out=stopped, collect_errors=1)
        return SuiteRun(
            outcomes=raw["outcomes"],
            messages=raw["messages"],
            lines=raw["lines"],
            collect_errors=raw["collect_errors"],
            duration_s=result.duration_s,
            cpu_s=result.cpu_time_s,
            timed_out=result.timed_out or result.limit_hit is not None,
        )
