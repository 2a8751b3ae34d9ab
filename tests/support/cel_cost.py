"""kube-apiserver's static cost estimate of CRD ``x-kubernetes-validations`` rules (tests only).

When a CustomResourceDefinition is created or updated, the API server estimates each rule's
worst-case CEL cost and refuses the CRD when one rule's cost exceeds ``STATIC_RULE_LIMIT`` or all
rules together exceed ``STATIC_CRD_LIMIT``. This module redoes that arithmetic for the CEL subset
the emulator parses (``tests/kube_emulator/cel.py``), following the method of
apiextensions-apiserver (the schema's CEL declaration types, the rule's cardinality) and of
cel-go's checker (per-node costs), as of Kubernetes 1.30+:

* Sizes. A list's size is its ``maxItems``, a map's its ``maxProperties`` and a string's
  ``maxLength`` times 4 (bytes per rune); an enum string's is its longest value. Absent a bound,
  the size is how many of the smallest serialized element fit in a 3 MiB request: lists
  ``(3 MiB - 2) / (min + 1)``, maps ``(3 MiB - 2) / (min + 6)``, strings ``3 MiB - 2``. The
  smallest serialization of an object is ``{}`` plus each required property without a default
  (``len(name) + min(value) + 4``); strings 2, numbers 1, booleans 4, lists and maps 2.
* Costs. Literals cost 0; identifiers 1; a field selection 1 plus its operand; ``has()`` only its
  operand (Kubernetes turns cel-go's presence cost off); ``&&``/``||`` the sum of both sides;
  ``?:`` the condition plus the dearer branch; other calls 1 plus their arguments, except the
  size-dependent ones: ``==``/``!=`` and string ordering ``ceil(0.1 * min(size a, size b))``,
  ``x in list`` the list's size, string ``+`` ``ceil(0.1 * (size a + size b))``,
  ``startsWith``/``endsWith`` ``ceil(0.1 * size(prefix))``, ``contains``
  ``ceil(0.1 * size(s)) * ceil(0.1 * size(sub))`` and ``matches``
  ``ceil(0.1 * (size(s) + 1)) * ceil(0.25 * size(regex))``. Sizes of non-string scalars reached
  through ``self`` are 0 (the schema has no length for them), of literals 1.
* Macros are cel-go's comprehensions: ``range + init + result + size(range) * (condition +
  step)``, so nested macros multiply. ``all``: ``result 1, condition 2, step 1 + body``;
  ``exists``: ``1, 3, 1 + body``; ``exists_one``: ``2, 0, 2 + body``; ``map``: ``init 10,
  result 1, step 12 + body``; ``filter``: ``10, 1, 13 + body``.
* Cardinality. A rule's estimate is its cost times the number of times its node can occur: the
  product of ``maxItems``/``maxProperties`` of the lists and maps above it, or, when one of them is
  unbounded, ``3 MiB / (min size of the node + 1)``.

The unit tests pin these numbers to values from apiextensions-apiserver's own tests. Not modelled
(the CRDs do not use them): index expressions on unknown containers, ``messageExpression``,
optional types, timestamps/durations arithmetic and the Kubernetes extension libraries.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.kube_emulator.cel import compile_rule

MAX_REQUEST_BYTES = 3 * 1024 * 1024
STATIC_RULE_LIMIT = 10_000_000  # StaticEstimatedCostLimit
STATIC_CRD_LIMIT = 100_000_000  # StaticEstimatedCRDCostLimit
PER_CALL_LIMIT = 1_000_000  # celconfig.PerCallLimit: a rule's runtime cost on one node
UNKNOWN = 2**64 - 1
_STRING_FACTOR = 0.1
_REGEX_FACTOR = 0.25
_FORMAT_MAX = {"duration": 32, "date": 12, "date-time": 32}
_FORMAT_MIN = {"duration": 3, "date": 12, "date-time": 21}


class CostError(ValueError):
    """The rule would not compile on the API server (or is outside the modelled subset)."""


@dataclass
class Decl:
    """A schema node as CEL sees it (apiserver's DeclType): kind, size bound, smallest JSON."""

    kind: str  # object, map, list, string, int, double, bool, dyn
    max_elements: int = 0
    min_size: int = 1
    fields: dict[str, Decl] = field(default_factory=dict)
    elem: Decl | None = None


def _string_decl(schema: dict[str, Any]) -> Decl:
    fmt = schema.get("format", "")
    if fmt in _FORMAT_MAX:
        return Decl("string", _FORMAT_MAX[fmt], _FORMAT_MIN[fmt])
    if "maxLength" in schema:
        return Decl("string", max(0, schema["maxLength"]) * 4, 2)
    if schema.get("enum"):
        return Decl("string", max(len(str(v)) for v in schema["enum"]), 2)
    return Decl("string", MAX_REQUEST_BYTES - 2, 2)


def decl_of(schema: dict[str, Any], root: bool = False) -> Decl:
    """The declaration of a structural schema node (``root``: a resource's root, where
    ``metadata.name``/``generateName`` are always visible, unbounded unless the schema bounds
    them both)."""
    if schema.get("x-kubernetes-int-or-string"):
        bound = schema.get("maxLength")
        return Decl("dyn", bound * 4 if bound is not None else MAX_REQUEST_BYTES - 2, 1)
    if root:
        schema = _with_object_meta(schema)
    kind = schema.get("type")
    if kind == "array":
        items = decl_of(schema["items"])
        bound = schema.get("maxItems")
        n = (MAX_REQUEST_BYTES - 2) // (items.min_size + 1) if bound is None else bound
        return Decl("list", n, 2, elem=items)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        values = decl_of(schema["additionalProperties"])
        bound = schema.get("maxProperties")
        n = (MAX_REQUEST_BYTES - 2) // (values.min_size + 6) if bound is None else bound
        return Decl("map", n, 2, elem=values)
    if kind == "object":
        return _object_decl(schema)
    if kind == "string":
        return _string_decl(schema)
    scalars = {"integer": Decl("int", 0, 1), "number": Decl("double", 0, 1)}
    if kind in scalars:
        return scalars[kind]
    if kind == "boolean":
        return Decl("bool", 0, 4)
    raise CostError(f"schema node of type {kind!r} is not visible to CEL")


def _object_decl(schema: dict[str, Any]) -> Decl:
    required = set(schema.get("required", []))
    fields, min_size = {}, 2
    for name, prop in (schema.get("properties") or {}).items():
        fields[name] = decl_of(prop, root=bool(prop.get("x-kubernetes-embedded-resource")))
        if name in required and "default" not in prop:
            min_size += len(name) + fields[name].min_size + 4
    return Decl("object", 0, min_size, fields=fields)


def _with_object_meta(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties") or {}
    meta = (props.get("metadata") or {}).get("properties") or {}
    typed = all(meta.get(k, {}).get("type") == "string" for k in ("name", "generateName"))
    if typed and all(props.get(k, {}).get("type") == "string" for k in ("kind", "apiVersion")):
        return schema
    string = {"type": "string"}
    meta_schema = {"type": "object", "properties": {"name": string, "generateName": string}}
    return {**schema, "properties": {**props, **_TYPE_META, "metadata": meta_schema}}


_TYPE_META = {"kind": {"type": "string"}, "apiVersion": {"type": "string"}}


# ---------------------------------------------------------------- the cost walk
@dataclass(frozen=True)
class _Value:
    """What the walk knows of an expression: its declaration (when reached through ``self``),
    or its kind and a size computed from the expression (literals, concatenations)."""

    kind: str
    size: tuple[int, int] | None = None  # (min, max), when computed from the expression
    decl: Decl | None = None


def _ceil(n: int, factor: float) -> int:
    return UNKNOWN if n >= UNKNOWN else math.ceil(n * factor)


def _add(*xs: int) -> int:
    return min(UNKNOWN, sum(xs))


def _mul(a: int, b: int) -> int:
    return min(UNKNOWN, a * b)


def _size(v: _Value) -> int:
    """The largest size cel-go ascribes to a value (strings, lists, maps; scalars 1 or 0)."""
    if v.size is not None:
        return v.size[1]
    if v.decl is not None:
        return v.decl.max_elements
    return 1 if v.kind in ("int", "double", "bool", "null") else UNKNOWN


_LITERAL_KIND = {bool: "bool", int: "int", float: "double", str: "string", type(None): "null"}


class _Walk:
    def __init__(self, self_decl: Decl) -> None:
        self.scope: dict[str, _Value] = {
            "self": _Value(self_decl.kind, decl=self_decl),
            "oldSelf": _Value(self_decl.kind, decl=self_decl),
        }

    def cost(self, node: tuple) -> tuple[int, _Value]:
        kind = node[0]
        if kind == "lit":
            value = node[1]
            n = len(value) if isinstance(value, str) else 1
            return 0, _Value(_LITERAL_KIND[type(value)], size=(n, n))
        if kind == "var":
            if node[1] not in self.scope:
                raise CostError(f"undeclared reference to {node[1]!r}")
            return 1, self.scope[node[1]]
        if kind == "list":
            parts = [self.cost(n) for n in node[1]]
            return _add(10, *(c for c, _ in parts)), _Value("list", size=(len(parts),) * 2)
        if kind == "sel":
            return self._select(node)
        if kind in ("&&", "||"):
            return _add(self.cost(node[1])[0], self.cost(node[2])[0]), _Value("bool")
        if kind == "?":
            cond, (yes, a), (no, b) = self.cost(node[1])[0], self.cost(node[2]), self.cost(node[3])
            return _add(cond, max(yes, no)), a if _size(a) >= _size(b) else b
        if kind == "call":
            return self._call(node)
        if kind == "index":
            return self._index(node)
        if kind in ("!", "neg"):
            c, v = self.cost(node[1])
            return _add(1, c), _Value("bool" if kind == "!" else v.kind)
        return self._binary(node)

    def _select(self, node: tuple) -> tuple[int, _Value]:
        c, operand = self.cost(node[1])
        decl = operand.decl
        if decl is None or decl.kind not in ("object", "map"):
            raise CostError(f"cannot select {node[2]!r} from a {operand.kind}")
        target = decl.elem if decl.kind == "map" else decl.fields.get(node[2])
        if target is None:
            raise CostError(f"undefined field {node[2]!r}")
        return _add(c, 1), _Value(target.kind, decl=target)

    def _index(self, node: tuple) -> tuple[int, _Value]:
        (ca, container), (cb, _) = self.cost(node[1]), self.cost(node[2])
        decl = container.decl
        if decl is None or decl.elem is None:
            raise CostError(f"cannot index a {container.kind}")
        return _add(1, ca, cb), _Value(decl.elem.kind, decl=decl.elem)

    def _binary(self, node: tuple) -> tuple[int, _Value]:
        op = node[0]
        (ca, a), (cb, b) = self.cost(node[1]), self.cost(node[2])
        args = _add(ca, cb)
        if op in ("==", "!=") or (op in ("<", "<=", ">", ">=") and a.kind == "string"):
            return _add(_ceil(min(_size(a), _size(b)), _STRING_FACTOR), args), _Value("bool")
        if op == "in":
            container = b.decl.kind if b.decl else b.kind
            return _add(_size(b) if container == "list" else 1, args), _Value("bool")
        if op == "+" and a.kind == "string":
            total = _add(_size(a), _size(b))
            return _add(_ceil(total, _STRING_FACTOR), args), _Value("string", size=(0, total))
        if op in ("<", "<=", ">", ">="):
            return _add(1, args), _Value("bool")
        return _add(1, args), _Value(a.kind if a.kind == b.kind else "double")

    def _call(self, node: tuple) -> tuple[int, _Value]:
        _, name, target, args = node
        if name == "has" and target is None:
            (arg,) = args
            if arg[0] != "sel":
                raise CostError("has() needs a field selection")
            self._select(arg)  # type-checks the field
            return self.cost(arg[1])[0], _Value("bool")
        if name in _MACROS and target is not None:
            return self._macro(name, target, args)
        if target is None:  # size(x) and the conversions take their subject first
            target, args = args[0], args[1:]
        ct, subject = self.cost(target)
        parts = [self.cost(a) for a in args]
        total = _add(ct, *(c for c, _ in parts))
        return _add(self._function(name, subject, [v for _, v in parts]), total), _RESULT[name]

    def _function(self, name: str, subject: _Value, args: list[_Value]) -> int:
        if name in ("startsWith", "endsWith"):
            return _ceil(_size(args[0]), _STRING_FACTOR)
        if name == "contains":
            return _mul(
                _ceil(_size(subject), _STRING_FACTOR), _ceil(_size(args[0]), _STRING_FACTOR)
            )
        if name == "matches":
            text = _ceil(_add(_size(subject), 1), _STRING_FACTOR)
            return _mul(text, _ceil(_size(args[0]), _REGEX_FACTOR))
        return 1

    def _macro(self, name: str, target: tuple, args: list[tuple]) -> tuple[int, _Value]:
        var, body = args
        range_cost, collection = self.cost(target)
        decl = collection.decl
        if decl is None or decl.kind not in ("list", "map"):
            raise CostError(f"{name}() over a {collection.kind}: must be a list or a map")
        item = decl.elem if decl.kind == "list" else Decl("string", 0, 2)  # map keys
        assert item is not None
        saved = self.scope.get(var[1])
        self.scope[var[1]] = _Value(item.kind, decl=item)
        body_cost = self.cost(body)[0]
        if saved is None:
            del self.scope[var[1]]
        else:
            self.scope[var[1]] = saved
        init, result, per_item = _MACRO_COST[name]
        loop = _mul(decl.max_elements, _add(per_item, body_cost))
        kind = "bool" if name in ("all", "exists", "exists_one") else "list"
        return _add(range_cost, init, result, loop), _Value(kind, size=(0, decl.max_elements))


_MACROS = {"all", "exists", "exists_one", "map", "filter"}
# (accumulator init, result, condition + step without the body) of cel-go's macro expansions
_MACRO_COST = {
    "all": (0, 1, 3),
    "exists": (0, 1, 4),
    "exists_one": (0, 2, 2),
    "map": (10, 1, 12),
    "filter": (10, 1, 13),
}
_RESULT = {
    "size": _Value("int", size=(1, 1)),
    "int": _Value("int", size=(1, 1)),
    "double": _Value("double", size=(1, 1)),
    "string": _Value("string"),
    "matches": _Value("bool"),
    "startsWith": _Value("bool"),
    "endsWith": _Value("bool"),
    "contains": _Value("bool"),
}


def rule_cost(rule: str, node: Decl) -> int:
    """cel-go's maximum estimated cost of ``rule`` attached to a node declared ``node``."""
    try:
        ast = compile_rule(rule)
    except ValueError as e:
        raise CostError(f"cannot parse {rule!r}: {e}") from e
    return _Walk(node).cost(ast)[0]


# ---------------------------------------------------------------- a CRD's rules
@dataclass(frozen=True)
class RuleCost:
    path: str
    rule: str
    cost: int  # one evaluation
    cardinality: int  # how many times the node can occur
    estimate: int  # what the API server compares with STATIC_RULE_LIMIT


def _rules(schema: dict[str, Any], path: str, bound: int | None, root: bool) -> Iterator[RuleCost]:
    rules = schema.get("x-kubernetes-validations") or []
    if rules:
        node = decl_of(schema, root=root)
        times = bound if bound is not None else MAX_REQUEST_BYTES // (node.min_size + 1)
        for r in rules:
            cost = rule_cost(r["rule"], node)
            yield RuleCost(path, r["rule"], cost, times, min(UNKNOWN, cost * times))
    for name, sub in (schema.get("properties") or {}).items():
        yield from _rules(sub, f"{path}.{name}", bound, False)
    for key, suffix, limit in (("items", "[*]", "maxItems"), ("additionalProperties", "{*}", "maxProperties")):  # fmt: skip
        sub = schema.get(key)
        if isinstance(sub, dict):
            n = schema.get(limit)
            inner = None if bound is None or n is None else bound * n
            yield from _rules(sub, path + suffix, inner, False)


def crd_rule_costs(crd: dict[str, Any]) -> list[RuleCost]:
    """Every rule of every version of ``crd`` with its estimated cost."""
    out = []
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        out += list(_rules(schema, version["name"], 1, True))
    return out


def crd_errors(crd: dict[str, Any]) -> list[str]:
    """What the API server would refuse of ``crd``'s rules on cost grounds (empty: accepted)."""
    costs = crd_rule_costs(crd)
    errors = [
        f"{c.path}: estimated rule cost {c.estimate} exceeds {STATIC_RULE_LIMIT}: {c.rule}"
        for c in costs
        if c.estimate > STATIC_RULE_LIMIT
    ]
    total = sum(c.estimate for c in costs)
    if total > STATIC_CRD_LIMIT:
        errors.append(f"total estimated cost {total} exceeds {STATIC_CRD_LIMIT}")
    return errors
