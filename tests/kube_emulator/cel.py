"""A small CEL subset for CRD ``x-kubernetes-validations`` rules (pure).

Supported: ``self`` and field selection, ``has(a.b)``, int/double/string/bool/null literals,
lists ``[...]``, indexing, ``! - * / % + -``, comparisons, ``in``, ``&& ||``, ``?:``, and the
functions ``size``, ``matches``, ``startsWith``, ``endsWith``, ``contains``, ``int``, ``double``,
``string`` plus the macros ``all``, ``exists``, ``exists_one`` on lists and maps. A rule that uses
anything else (``messageExpression``, maps literals, timestamps, quantities, optional types)
raises :class:`Unsupported` and the caller skips it. Transition rules (``oldSelf``) are evaluated
on updates, where the old object has the node, as the API server does.
"""

from __future__ import annotations

import math
import re
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d+|\d+)|(?P<str>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:()\[\].,]))"
)
_MACROS = {"all", "exists", "exists_one"}
_FUNCTIONS = {
    "has",
    "size",
    "matches",
    "startsWith",
    "endsWith",
    "contains",
    "int",
    "double",
    "string",
}
_BINARY = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%")]


class Unsupported(ValueError):
    """The rule uses CEL outside the subset; it is skipped, not failed."""


class CelError(ValueError):
    """A runtime error (no such key, bad types): the server rejects the object with it."""


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise Unsupported(f"cannot tokenize CEL at {text[pos:]!r}")
        out.append(m.group(m.lastgroup or "op"))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise Unsupported(f"expected {expected!r}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple:
        node = self.expr()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        return node

    def expr(self) -> tuple:
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take("?")
        yes = self.expr()
        self.take(":")
        return ("?", cond, yes, self.expr())

    def binary(self, level: int) -> tuple:
        if level == len(_BINARY):
            return self.unary()
        node = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            node = (self.take(), node, self.binary(level + 1))
        return node

    def unary(self) -> tuple:
        if self.peek() in ("!", "-"):
            op = self.take()
            return ("neg" if op == "-" else "!", self.unary())
        return self.member(self.primary())

    def member(self, node: tuple) -> tuple:
        while self.peek() in (".", "["):
            if self.take() == "[":
                node = ("index", node, self.expr())
                self.take("]")
                continue
            name = self.take()
            if self.peek() == "(":
                node = ("call", _known(name), node, self.args())
            else:
                node = ("sel", node, name)
        return node

    def args(self) -> list[tuple]:
        self.take("(")
        out = []
        while self.peek() != ")":
            out.append(self.expr())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return out

    def primary(self) -> tuple:
        tok = self.take()
        if tok == "(":
            node = self.expr()
            self.take(")")
            return node
        if tok == "[":
            items = []
            while self.peek() != "]":
                items.append(self.expr())
                if self.peek() == ",":
                    self.take(",")
            self.take("]")
            return ("list", items)
        if tok[0].isdigit():
            return ("lit", float(tok) if "." in tok else int(tok))
        if tok[0] in "'\"":
            return ("lit", tok[1:-1].encode().decode("unicode_escape"))
        if tok in ("true", "false", "null"):
            return ("lit", {"true": True, "false": False, "null": None}[tok])
        if not (tok[0].isalpha() or tok[0] == "_"):
            raise Unsupported(f"unsupported token {tok!r}")
        if self.peek() == "(":
            return ("call", _known(tok), None, self.args())
        return ("var", tok)


def _known(name: str) -> str:
    """Reject unknown functions when compiling, so such a rule is skipped as a whole."""
    if name not in _FUNCTIONS and name not in _MACROS:
        raise Unsupported(f"function {name!r}")
    return name


def compile_rule(rule: str) -> tuple:
    return _Parser(rule).parse()


def evaluate(node: tuple, env: dict[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "var":
        if node[1] not in env:
            raise CelError(f"undeclared reference to {node[1]!r}")
        return env[node[1]]
    if kind == "list":
        return [evaluate(n, env) for n in node[1]]
    if kind == "sel":
        obj = evaluate(node[1], env)
        if not isinstance(obj, dict) or node[2] not in obj:
            raise CelError(f"no such key: {node[2]}")
        return obj[node[2]]
    if kind == "index":
        return _index(evaluate(node[1], env), evaluate(node[2], env))
    if kind == "?":
        return evaluate(node[2] if _bool(evaluate(node[1], env)) else node[3], env)
    if kind == "!":
        return not _bool(evaluate(node[1], env))
    if kind == "neg":
        return -_number(evaluate(node[1], env))
    if kind == "&&":
        return _bool(evaluate(node[1], env)) and _bool(evaluate(node[2], env))
    if kind == "||":
        return _bool(evaluate(node[1], env)) or _bool(evaluate(node[2], env))
    if kind == "call":
        return _call(node, env)
    return _arith(kind, evaluate(node[1], env), evaluate(node[2], env))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError(f"no matching overload: expected bool, got {value!r}")
    return value


def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CelError(f"no matching overload: expected a number, got {value!r}")
    return value


def _index(obj: Any, key: Any) -> Any:
    try:
        return obj[key]
    except (KeyError, IndexError, TypeError) as e:
        raise CelError(f"no such key: {key}") from e


def _arith(op: str, a: Any, b: Any) -> Any:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "in":
        return a in b
    if op == "+" and isinstance(a, str | list):
        return a + b
    if op in ("<", "<=", ">", ">=") and isinstance(a, str) and isinstance(b, str):
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    a, b = _number(a), _number(b)
    if op in ("/", "%") and b == 0:
        raise CelError("division by zero")
    both_int = isinstance(a, int) and isinstance(b, int)
    table = {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
        "/": lambda: int(a / b) if both_int else a / b,
        "%": lambda: int(math.fmod(a, b)),
        "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
    }  # fmt: skip
    if op not in table:
        raise Unsupported(f"operator {op!r}")
    return table[op]()


def _call(node: tuple, env: dict[str, Any]) -> Any:
    _, name, target, args = node
    if name == "has" and target is None:
        (arg,) = args
        if arg[0] != "sel":
            raise Unsupported("has() needs a field selection")
        obj = evaluate(arg[1], env)
        return isinstance(obj, dict) and arg[2] in obj
    if name in _MACROS and target is not None:
        return _macro(name, evaluate(target, env), args, env)
    values = [evaluate(a, env) for a in args]
    subject = evaluate(target, env) if target is not None else values.pop(0)
    return _function(name, subject, values)


def _macro(name: str, collection: Any, args: list[tuple], env: dict[str, Any]) -> bool:
    var, body = args
    if var[0] != "var":
        raise Unsupported("macro variable must be an identifier")
    results = [_bool(evaluate(body, {**env, var[1]: item})) for item in collection]
    if name == "all":
        return all(results)
    return any(results) if name == "exists" else results.count(True) == 1


def _function(name: str, subject: Any, args: list[Any]) -> Any:
    if name == "size":
        return len(subject)
    if name == "matches":
        return re.search(args[0], subject) is not None
    if name == "startsWith":
        return subject.startswith(args[0])
    if name == "endsWith":
        return subject.endswith(args[0])
    if name == "contains":
        return args[0] in subject
    if name in ("int", "double", "string"):
        return {"int": int, "double": float, "string": str}[name](subject)
    raise Unsupported(f"function {name!r}")


_NO_OLD = object()


def check_rules(value: Any, schema: dict, path: str = "", old: Any = _NO_OLD) -> list[str]:
    """Messages of the failed rules under ``schema`` (``old``: the node's stored value on an
    update, for transition rules; absent on a create or where the old object lacks the node)."""
    errors = []
    for rule in schema.get("x-kubernetes-validations") or []:
        errors += _check_rule(value, rule, path, old)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            sub_schema = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub_schema is not None:
                before = old.get(key, _NO_OLD) if isinstance(old, dict) else _NO_OLD
                errors += check_rules(sub, sub_schema, f"{path}.{key}" if path else key, before)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):  # no transition rules inside lists here
            errors += check_rules(item, schema["items"], f"{path}[{i}]")
    return errors


def _check_rule(value: Any, rule: dict, path: str, old: Any = _NO_OLD) -> list[str]:
    text = rule.get("rule", "")
    env = {"self": value}
    if "oldSelf" in text:
        if old is _NO_OLD or old is None:
            return []  # a transition rule applies to updates of an existing node only
        env["oldSelf"] = old
    try:
        ok = evaluate(compile_rule(text), env)
    except Unsupported:
        return []
    except (CelError, TypeError, ValueError, re.error) as e:
        return [f'{path or "<root>"}: Invalid value: "object": {e} evaluating rule: {text}']
    if ok is True:
        return []
    where = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
    message = rule.get("message") or f"failed rule: {text}"
    return [f'{where or "<root>"}: Invalid value: "object": {message}']
