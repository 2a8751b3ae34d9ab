"""Fault injection rules that tests arm on the emulator: errors, forced conflicts, latency.

A rule matches a request by verb (``get``, ``list``, ``watch``, ``create``, ``update``,
``patch``, ``delete``, ``deletecollection``; ``None`` for any) and a regular expression searched
in the URL path (``None`` for any). ``times`` counts down per matching request; ``None`` means
forever (until :meth:`Faults.clear`). Watch streams are dropped with ``KubeEmulator.drop_watches``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass


@dataclass
class Rule:
    action: str  # "error", "conflict", "latency"
    verb: str | None = None
    path: str | None = None
    times: int | None = 1
    code: int = 500
    message: str = "injected fault"
    delay: float = 0.0
    hits: int = 0

    def matches(self, verb: str, path: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.verb is not None and self.verb != verb:
            return False
        return self.path is None or re.search(self.path, path) is not None


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rules: list[Rule] = []

    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def fail_next(
        self,
        times: int | None = 1,
        verb: str | None = None,
        path: str | None = None,
        code: int = 500,
        message: str = "injected fault",
    ) -> Rule:
        """The next ``times`` matching requests get ``code`` (a ``Status`` body) and do nothing."""
        return self._add(Rule("error", verb, path, times, code, message))

    def conflict_next(
        self, times: int | None = 1, verb: str | None = None, path: str | None = None
    ) -> Rule:
        """The next matching writes (update/patch by default) get a 409 Conflict."""
        return self._add(Rule("conflict", verb, path, times, 409))

    def add_latency(
        self,
        seconds: float,
        verb: str | None = None,
        path: str | None = None,
        times: int | None = None,
    ) -> Rule:
        return self._add(Rule("latency", verb, path, times, delay=seconds))

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def take(self, verb: str, path: str) -> list[Rule]:
        """Consume and return the rules that fire for this request."""
        fired = []
        with self._lock:
            for rule in self.rules:
                writes_only = rule.action == "conflict" and rule.verb is None
                if writes_only and verb not in ("update", "patch"):
                    continue
                if rule.matches(verb, path):
                    rule.hits += 1
                    if rule.times is not None:
                        rule.times -= 1
                    fired.append(rule)
        return fired
