"""Label and field selectors, parsed once per request (pure).

Label selectors follow the Kubernetes grammar: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, ``k`` (exists) and ``!k`` (does not exist), joined by commas.
Field selectors support ``metadata.name`` and ``metadata.namespace`` with ``=``, ``==`` and
``!=``, like the real server does for most kinds; any other field is rejected as a bad request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Predicate = Callable[[dict], bool]

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")
# Field labels: every kind's metadata ones, and those of Events (what ``kubectl describe`` lists an
# object's events by) and Pods.
_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    **{f"involvedObject.{k}": ("involvedObject", k)
       for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
    "reason": ("reason",),
    "type": ("type",),
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
}  # fmt: skip


def _field(obj: dict, path: tuple[str, ...]) -> str:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return "" if obj is None else str(obj)


class SelectorError(ValueError):
    """A selector the server cannot parse; becomes a 400 BadRequest."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=" and "notin"


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``( )`` value lists."""
    terms, depth, current = [], 0, []
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    reqs: list[Requirement] = []
    for term in _split_terms(text or ""):
        eq = _EQ_RE.match(term)
        if eq:
            op = "!=" if eq.group(2) == "!=" else "="
            reqs.append(Requirement(eq.group(1), op, frozenset([eq.group(3)])))
            continue
        st = _SET_RE.match(term)
        if not st:
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
        neg, key, op, values = st.groups()
        if op:
            if neg:
                raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
            vals = frozenset(v.strip() for v in values.split(",") if v.strip())
            reqs.append(Requirement(key, op, vals))
        else:
            reqs.append(Requirement(key, "!exists" if neg else "exists"))
    return reqs


def parse_field_selector(text: str | None) -> list[tuple[tuple[str, str], bool, str]]:
    """Return ``(path, equal, value)`` triples."""
    out = []
    for term in _split_terms(text or ""):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m or m.group(1) not in _FIELDS:
            raise SelectorError(f"field label not supported: {term.strip()!r}")
        out.append((_FIELDS[m.group(1)], m.group(2) != "!=", m.group(3)))
    return out


def make_predicate(label_selector: str | None, field_selector: str | None) -> Predicate:
    """Compile both selectors into one predicate over an object body."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector)

    def predicate(obj: dict) -> bool:
        meta = obj.get("metadata") or {}
        obj_labels = meta.get("labels") or {}
        if not all(r.matches(obj_labels) for r in labels):
            return False
        return all((_field(obj, path) == value) == equal for path, equal, value in fields)

    return predicate
