"""Names and strings as Python code means them, for the graders' detectors (``ast``, never text).

``Scope`` follows a module's aliases (``import gc as g``, ``from sys import _getframe as f``,
``x = gc``), dynamic imports (``__import__``, ``importlib.import_module``, ``sys.modules[...]``),
``getattr``/``vars``/``__dict__`` with constant names, and folds strings built from constant parts
(concatenation, f-strings, ``%``, ``str.join``, ``os.path.join``, ``Path / ...``, ``chr``,
slicing, ``str.format``): the obvious spellings of a name a detector looks for. A part that is
not constant folds to ``WILD``. Pure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

WILD = "\x00"  # a part of a folded string that is not a constant
IMPORTERS = frozenset(
    {"__import__", "builtins.__import__", "importlib.import_module", "importlib.__import__"}
)


def _index(node: ast.expr | None) -> int | tuple[()] | None:
    """A slice bound: an int, ``()`` when absent, None when not a constant int."""
    if node is None:
        return ()
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return sign * node.value
    return None


def _fold_join(sep: str | None, parts: list[str | None]) -> str | None:
    if sep is None or any(p is None for p in parts):
        return None
    return sep.join(p for p in parts if p is not None)


@dataclass
class Scope:
    """One module's aliases (name -> dotted name it stands for) and string constants. Flat, over
    the whole module: a name bound anywhere to a module or a constant is taken to be it
    everywhere (an over-approximation, which is what a screen wants)."""

    aliases: dict[str, str] = field(default_factory=dict)
    strings: dict[str, str] = field(default_factory=dict)

    def fold(self, node: ast.AST) -> str | None:
        """The string ``node`` evaluates to, ``WILD`` for parts that are not constant; None when
        it is not a string expression at all."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return node.value
            return node.value.decode("latin-1") if isinstance(node.value, bytes) else None
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        if isinstance(node, ast.JoinedStr):
            return "".join(
                (self.fold(v) or WILD) if isinstance(v, ast.Constant) else WILD for v in node.values
            )
        if isinstance(node, ast.BinOp):
            return self._fold_binop(node)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return self._fold_slice(node.value, node.slice)
        if isinstance(node, ast.Call):
            return self._fold_call(node)
        return None

    def _fold_binop(self, node: ast.BinOp) -> str | None:
        left, right = self.fold(node.left), self.fold(node.right)
        if isinstance(node.op, ast.Add) and (left is not None or right is not None):
            return (left if left is not None else WILD) + (right if right is not None else WILD)
        if isinstance(node.op, ast.Div) and (left is not None or right is not None):
            return f"{left if left is not None else WILD}/{right if right is not None else WILD}"
        if isinstance(node.op, ast.Mod):
            return left
        return None

    def _fold_slice(self, value: ast.expr, s: ast.Slice) -> str | None:
        text = self.fold(value)
        parts = [_index(b) for b in (s.lower, s.upper, s.step)]
        ints = [p for p in parts if isinstance(p, int)]
        if text is None or WILD in text or len(ints) != sum(p != () for p in parts):
            return None
        lower, upper, step = (p if isinstance(p, int) else None for p in parts)
        return None if step == 0 else text[lower:upper:step]

    def _fold_call(self, node: ast.Call) -> str | None:
        f, args = node.func, node.args
        name = self.qual(f)
        if isinstance(f, ast.Attribute) and f.attr == "join" and len(args) == 1:
            seq = args[0]
            if isinstance(seq, ast.List | ast.Tuple):
                return _fold_join(self.fold(f.value), [self.fold(e) for e in seq.elts])
        if name in {"os.path.join", "posixpath.join", "pathlib.Path", "pathlib.PurePath", "Path"}:
            return _fold_join("/", [self.fold(a) for a in args])
        if isinstance(f, ast.Attribute) and f.attr in {"format", "decode", "encode", "lower"}:
            return self.fold(f.value)
        if name == "chr" and len(args) == 1 and isinstance(args[0], ast.Constant):
            code = args[0].value
            return chr(code) if isinstance(code, int) and 0 <= code < 0x110000 else None
        if name == "str" and len(args) == 1:
            return self.fold(args[0])
        return None

    def name(self, node: ast.AST) -> str | None:
        """A folded string that is wholly constant (a module or attribute name), else None."""
        text = self.fold(node)
        return text if text is not None and WILD not in text else None

    def qual(self, node: ast.AST) -> str | None:
        """The dotted name ``node`` stands for (``sys._getframe``, ``gc``), through aliases,
        dynamic imports, ``getattr``, ``vars`` and ``sys.modules``; None when it has none."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value)
            return f"{base or '?'}.{node.attr}"
        if isinstance(node, ast.Subscript):
            return self._qual_item(node.value, node.slice)
        if isinstance(node, ast.Call):
            return self._qual_call(node)
        return None

    def _qual_item(self, value: ast.expr, key: ast.expr) -> str | None:
        base, item = self.qual(value), self.name(key)
        if base is None or item is None:
            return None
        if base == "sys.modules":
            return item
        if base.endswith(".__dict__") or base == "__builtins__":
            return f"{base.removesuffix('.__dict__')}.{item}"
        return None

    def _qual_call(self, node: ast.Call) -> str | None:
        fn, args = self.qual(node.func), node.args
        if fn in IMPORTERS and args:
            return self.name(args[0])
        if fn in {"getattr", "builtins.getattr"} and len(args) >= 2:
            attr = self.name(args[1])
            return f"{self.qual(args[0]) or '?'}.{attr if attr is not None else WILD}"
        if fn in {"vars", "builtins.vars"} and len(args) == 1:
            base = self.qual(args[0])
            return f"{base}.__dict__" if base else None
        if fn in {"sys.modules.get", "sys.modules.__getitem__"} and args:
            return self.name(args[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr in {"get", "__getitem__"}:
            return self._qual_item(node.func.value, args[0]) if args else None
        return None


def scope_of(tree: ast.Module) -> Scope:
    """Aliases and string constants bound anywhere in ``tree`` (two passes: an alias may be
    bound to another alias bound later in the text)."""
    scope = Scope()
    for _ in range(2):
        for node in ast.walk(tree):
            _bind(scope, node)
    return scope


def _bind(scope: Scope, node: ast.AST) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                scope.aliases[a.asname] = a.name
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for a in node.names:
            scope.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    elif isinstance(node, ast.Assign | ast.NamedExpr | ast.AnnAssign) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, ast.Name):
                _bind_name(scope, t.id, node.value)


def _bind_name(scope: Scope, name: str, value: ast.expr) -> None:
    text = scope.name(value)
    if text is not None:
        scope.strings.setdefault(name, text)
        return
    q = scope.qual(value)
    if q is not None and q != name and not q.startswith("?"):
        scope.aliases.setdefault(name, q)
