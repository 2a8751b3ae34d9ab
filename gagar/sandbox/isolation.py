"""Which isolation a sandbox executor uses: ``bubblewrap``, ``pod``, or ``auto`` (probe, then the
strongest that works here).

``bubblewrap`` (``bwrapjail.py``/``bwrap.py``) gives every command namespaces of its own: its own
filesystem view, PID space and loopback-only network, on top of what ``pod`` gives. ``pod``
(``podjail.py``) needs no namespaces and relies on the pod, i.e. its runtime class, for those.
``auto`` probes bubblewrap with a trivial jailed command; where the runtime refuses namespaces
(a stock runc node: its default seccomp profile refuses ``unshare`` and ``mount`` without
``CAP_SYS_ADMIN``, and its masked ``/proc`` refuses a fresh one) it takes ``pod``, says why in one
line, and never fails where ``pod`` works. Only when neither works does it refuse
(``SandboxUnavailable`` with both reasons), so an executor never runs code without a boundary it
can name. A ``LocalFactory`` made for the resolved mode gives each session the jail of that mode
(``local.JAILS``). ``Choice.mode`` is what the executor reports (log line, ``/healthz``, the
``gagar_sandbox_isolation`` metric).

``agent-sandbox`` is not an executor's mode but the cluster's (``agent.py``): every session is a
Sandbox pod of its own, claimed from a warm pool, whose executor runs ``auto``; ``choose`` refuses
it with that explanation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from gagar.sandbox.types import Isolation, Limits, SandboxUnavailable
from gagar.spec import SandboxIsolation

if TYPE_CHECKING:
    from gagar.sandbox.local import LocalFactory

Mode = Literal["bubblewrap", "pod"]  # what an executor runs as once ``auto`` is resolved
MODES: tuple[str, ...] = get_args(SandboxIsolation)
EXECUTOR_MODES = tuple(m for m in MODES if m != "agent-sandbox")  # what ``choose`` resolves
BACKEND: dict[str, Isolation] = {"bubblewrap": "bwrap", "pod": "pod"}
REPORTED: dict[Isolation, str] = {"bwrap": "bubblewrap", "pod": "pod", "none": "none"}


@dataclass(frozen=True)
class Choice:
    mode: Mode
    why: str  # one line: what was asked and, for ``auto``, why a stronger mode was not taken

    @property
    def backend(self) -> Isolation:
        return BACKEND[self.mode]


def _probe(mode: Mode) -> str | None:
    """``None`` when ``mode`` runs a trivial command here, else the reason it cannot."""
    from gagar.sandbox import podjail
    from gagar.sandbox.local import check_isolation

    try:
        (check_isolation if mode == "bubblewrap" else podjail.check)()
    except SandboxUnavailable as e:
        return str(e)
    return None


def choose(asked: SandboxIsolation) -> Choice:
    """Resolve ``asked`` on this machine; raise ``SandboxUnavailable`` when it cannot run."""
    if asked == "agent-sandbox":
        raise SandboxUnavailable(
            "isolation agent-sandbox claims a Sandbox pod per session (sandbox.backend pods, "
            "gagar.sandbox.agent); an executor itself runs bubblewrap, pod or auto"
        )
    if asked != "auto":
        reason = _probe(asked)
        if reason is not None:
            raise SandboxUnavailable(f"isolation {asked} does not work here: {reason}")
        return Choice(asked, f"isolation {asked} (as asked)")
    refused = _probe("bubblewrap")
    if refused is None:
        return Choice("bubblewrap", "isolation bubblewrap (auto: namespaces work here)")
    pod = _probe("pod")
    if pod is None:
        return Choice("pod", f"isolation pod (auto: bubblewrap cannot run here: {refused})")
    raise SandboxUnavailable(f"no isolation works here: bubblewrap: {refused}; pod: {pod}")


def factory(
    asked: SandboxIsolation,
    limits: Limits | None = None,
    root: str | None = None,
    environments: Mapping[str, str] | None = None,
) -> tuple[LocalFactory, Choice]:
    """A ``LocalFactory`` in the mode ``asked`` resolves to here, and the ``Choice``;
    ``environments``: the task environments' virtual environments (``venvs.py``), by name."""
    from gagar.sandbox.local import LocalFactory

    choice = choose(asked)
    made = LocalFactory(
        limits=limits, isolation=choice.backend, root=root, environments=environments
    )
    return made, choice


__all__ = ["BACKEND", "EXECUTOR_MODES", "MODES", "REPORTED", "Choice", "Mode", "choose", "factory"]
