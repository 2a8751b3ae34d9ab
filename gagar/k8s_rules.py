"""Kubernetes' own rules for the names and values a GagarRun hands to the API server (pure).

``gagar.spec`` types its fields with these, so a value the API server would refuse when the
operator creates the pods (a namespace that is not a DNS-1123 label, a label key with two
slashes, a 70-character label value, a ``subPath`` that climbs out of its volume) is refused by
pydantic (``gagar validate`` names the field) and, where a ``pattern``/``maxLength`` can say
it, by the CRD at ``kubectl apply``. The rules are apimachinery's ``validation.go``:
``IsDNS1123Label``/``IsDNS1123Subdomain``, ``IsQualifiedName`` (label and annotation keys),
``IsValidLabelValue``, ``ValidateAnnotations`` (256 KiB in all), ``IsEnvVarName`` and
``validateLocalDescendingPath`` (``subPath``). Every pattern here is RE2 (no look-arounds), as the
API server's regular expressions are.

Not in the CRD (pydantic, ``gagar validate`` and the operator's boundary only): the keys of
labels, node selectors and annotations (a structural schema cannot constrain map keys, and a CEL
regular expression over them exceeds the API server's cost budget) and the annotations' total
size (CEL has no cheap sum).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from annotated_types import MaxLen
from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

# "[.]" rather than "\.": the same text reads alike in Python, in Go (RE2) and in JSON
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = rf"^{_LABEL}$"
DNS1123_SUBDOMAIN = rf"^{_LABEL}([.]{_LABEL})*$"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
QUALIFIED_NAME = rf"^({_LABEL}([.]{_LABEL})*/)?{_NAME}$"
# the lengths of a qualified name: a prefix of at most 253, a name of at most 63
QUALIFIED_NAME_LENGTHS = r"^([^/]{1,253}/)?[^/]{1,63}$"
LABEL_VALUE = rf"^({_NAME})?$"
ENV_VAR_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# a relative path none of whose elements is "..": ".", "..x", ".x" and "x..." are fine
_ELEMENT = r"([.]|[.][.][^/]+|[.][^./][^/]*|[^./][^/]*)"
SUB_PATH = rf"^({_ELEMENT}(/{_ELEMENT}?)*)?$"
MAX_ANNOTATIONS_BYTES = 256 * 1024
# an unquoted quantity's bound (spec.MAX_NUMBER: the CRD gives every number finite bounds)
MAX_QUANTITY_INTEGER = 10**15
# A quantity as the API server parses it (a decimal exponent must fit an int32: three digits
# here), a subset of its grammar: no sign, a digit first.
QUANTITY = r"^[0-9]{1,20}([.][0-9]{1,20})?([eE][0-9]{1,3}|[KMGTPE]i?|[munk])?$"
QUALIFIED = (
    "a qualified name: an optional DNS-1123 subdomain prefix of at most 253 characters and "
    "'/', then at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends"
)


def _rule(pattern: str, what: str, max_length: int | None = None) -> tuple[Any, Any]:
    """A pydantic check that names the rule (not its regular expression), and the same
    ``pattern``/``maxLength`` in the JSON schema, hence in the CRD."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if (max_length is not None and len(value) > max_length) or not regex.fullmatch(value):
            raise ValueError(f"{value[:80]!r} is not {what}")
        return value

    schema: dict[str, Any] = {"type": "string", "pattern": pattern}
    if max_length is not None:
        schema["maxLength"] = max_length
    return AfterValidator(check), WithJsonSchema(schema)


Namespace = Annotated[
    str, *_rule(DNS1123_LABEL, "a DNS-1123 label (at most 63 of a-z, 0-9, '-'; alnum ends)", 63)
]
Subdomain = Annotated[
    str, *_rule(DNS1123_SUBDOMAIN, "a DNS-1123 subdomain (DNS-1123 labels joined by '.')", 253)
]
LabelValue = Annotated[
    str, *_rule(LABEL_VALUE, "a label value (at most 63 of A-Za-z0-9-_.; alnum ends)", 63)
]
EnvVarName = Annotated[str, *_rule(ENV_VAR_NAME, "an environment variable name")]
SubPath = Annotated[str, *_rule(SUB_PATH, "a relative path without '..' elements")]


def _quantity_text(value: Any) -> Any:
    """An unquoted ``cpu: 32`` or ``nvidia.com/gpu: 1`` is a YAML integer, which Kubernetes takes
    (a quantity is int-or-string), so it becomes ``"32"``. A YAML float (``cpu: 0.5``) the CRD's
    int-or-string schema refuses, so it is refused here too, with what to write instead."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value > MAX_QUANTITY_INTEGER:
            raise ValueError(f"{value} is over {MAX_QUANTITY_INTEGER:.0e}: use a suffix (Ti, P)")
        return str(value)
    if isinstance(value, float):
        milli = f"{round(value * 1000)}m"
        raise ValueError(
            f"{value!r} is a number: write a quantity as a string ('{value}', '{milli}')"
        )
    return value


# The JSON schema (hence the CRD's) is the one Kubernetes gives a resource.Quantity:
# int-or-string, the pattern and a length for strings, no negative integers (the pattern has no
# sign). The API server applies each keyword to the values it fits (a pattern to strings only).
Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    _rule(QUANTITY, "a Kubernetes quantity (e.g. 500m, 16Gi, 1e3)", 64)[0],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY,
            "maxLength": 64,
            "minimum": 0,
            "maximum": MAX_QUANTITY_INTEGER,
        }
    ),
]


def bad_key(key: str) -> bool:
    return not (re.fullmatch(QUALIFIED_NAME, key) and re.fullmatch(QUALIFIED_NAME_LENGTHS, key))


def _key(key: str) -> str:
    if bad_key(key):
        raise ValueError(f"{key[:80]!r} is not {QUALIFIED}")
    return key


QualifiedName = Annotated[
    str,
    AfterValidator(_key),
    WithJsonSchema({"type": "string", "pattern": QUALIFIED_NAME, "maxLength": 317}),
]


def _keys(value: dict[str, str]) -> dict[str, str]:
    bad = sorted(k for k in value if bad_key(k))
    if bad:
        raise ValueError(f"{', '.join(repr(k[:80]) for k in bad[:3])}: not {QUALIFIED}")
    return value


def _annotations(value: dict[str, str]) -> dict[str, str]:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in _keys(value).items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise ValueError(
            f"annotations total {size} bytes, Kubernetes allows {MAX_ANNOTATIONS_BYTES}"
        )
    return value


# Keys are checked by pydantic only (gagar validate, and the operator's boundary, which marks
# the run failed with the field path): no structural schema can constrain a map's keys, and a CEL
# regular expression over them is refused by the API server's cost estimate (a key's length is
# unbounded to it). Values carry their pattern and maxLength into the CRD.
Labels = Annotated[dict[str, LabelValue], AfterValidator(_keys)]
# Annotations: qualified-name keys, any values, 256 KiB in all (so one value may take it all: the
# spec's default bound on strings would otherwise cut values at 4096 characters).
Annotations = Annotated[
    dict[str, Annotated[str, MaxLen(MAX_ANNOTATIONS_BYTES)]], AfterValidator(_annotations)
]


# ---------------------------------------------------------------- pod specs
# The API server's own checks of a pod spec's containers and mounts (``ValidateVolumeMounts`` and
# ``validateLocalDescendingPath`` in kubernetes' pkg/apis/core/validation/validation.go), for the
# pods the operator renders: ``gagar validate`` and the operator's boundary refuse a run whose pods
# the server would refuse, before anything is applied. Messages are the server's
# (``field: Not found: "x"``); paths are relative to the pod spec.


def _quoted(value: Any) -> str:
    """A bad value as the server prints it (Go's ``%q`` for strings)."""
    return json.dumps(value) if isinstance(value, str) else str(value)


def _descending(path: str, where: str) -> list[str]:
    """``validateLocalDescendingPath``: relative, no ``..`` element. The server reports it at
    ``volumeMounts.subPath`` (its field path omits the index), and so does this."""
    out = []
    if path.startswith("/"):
        out.append(f"{where}: Invalid value: {_quoted(path)}: must be a relative path")
    if ".." in path.split("/"):
        out.append(f"{where}: Invalid value: {_quoted(path)}: must not contain '..'")
    return out


def volume_mount_problems(mounts: list[dict[str, Any]], volumes: set[str], where: str) -> list[str]:
    """What the server refuses in one container's ``volumeMounts``: a name that is no volume of
    the pod, a missing or repeated ``mountPath``, a ``subPath``/``subPathExpr`` that is absolute or
    climbs with ``..``, both of them at once."""
    out: list[str] = []
    seen: set[str] = set()
    for i, m in enumerate(mounts):
        at, mount_name, path = f"{where}[{i}]", m.get("name") or "", m.get("mountPath") or ""
        if not mount_name:
            out.append(f"{at}.name: Required value")
        if mount_name not in volumes:
            out.append(f"{at}.name: Not found: {_quoted(mount_name)}")
        if not path:
            out.append(f"{at}.mountPath: Required value")
        if path in seen:
            out.append(f"{at}.mountPath: Invalid value: {_quoted(path)}: must be unique")
        seen.add(path)
        sub, expr = m.get("subPath") or "", m.get("subPathExpr") or ""
        out += _descending(sub, f"{where}.subPath") if sub else []
        if expr and sub:
            out.append(f"{at}.subPathExpr: Invalid value: {_quoted(expr)}: "
                       "subPathExpr and subPath are mutually exclusive")  # fmt: skip
        out += _descending(expr, f"{where}.subPathExpr") if expr else []
    return out


def pod_spec_problems(spec: dict[str, Any]) -> list[str]:
    """The server's refusals of the mounts in a pod spec (containers and init containers)."""
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    out = []
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            where = f"{field}[{i}].volumeMounts"
            out += volume_mount_problems(c.get("volumeMounts") or [], volumes, where)
    return out
