"""Span edits that plant a bug in real source code and keep the file's formatting (pure).

Each edit replaces one span of the source text, located with the syntax tree's positions (``ast``
line and byte column, converted to character offsets; operators found among the tokens between
their operands), so the reference fix is the reverse of a one- or two-line diff. Kinds:

- ``flip_comparison``: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``in`` and
  ``not in``, ``is`` and ``is not`` swapped;
- ``flip_operator``: an arithmetic, bitwise or augmented-assignment operator swapped (``+``/``-``,
  ``*``/``/``, ``//``/``*``, ``%``/``//``, ``<<``/``>>``, ``&``/``|``), ``and``/``or`` too;
- ``flip_boolean``: ``True`` and ``False``;
- ``negate_condition``: an ``if``, ``while`` or conditional expression's test wrapped in
  ``not (...)``, or its ``not`` removed;
- ``drop_if``: an ``if`` without ``else`` removed with its body (whole lines);
- ``constant_shift``: an integer literal moved by one (``n - 1``, ``0`` to ``1``).

Only code inside function bodies is edited (what runs when a test calls it, not at import), and
every edit must parse and change the syntax tree.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
import tokenize
from dataclasses import dataclass
from typing import Literal, get_args

EditKind = Literal[
    "flip_comparison",
    "flip_operator",
    "flip_boolean",
    "negate_condition",
    "drop_if",
    "constant_shift",
]
EDIT_KINDS: tuple[EditKind, ...] = get_args(EditKind)  # in the miner's turn order

COMPARE: dict[type, tuple[tuple[str, ...], str]] = {  # op -> (its tokens, replacement)
    ast.Lt: (("<",), "<="),
    ast.LtE: (("<=",), "<"),
    ast.Gt: ((">",), ">="),
    ast.GtE: ((">=",), ">"),
    ast.Eq: (("==",), "!="),
    ast.NotEq: (("!=",), "=="),
    ast.In: (("in",), "not in"),
    ast.NotIn: (("not", "in"), "in"),
    ast.Is: (("is",), "is not"),
    ast.IsNot: (("is", "not"), "is"),
}
OPERATOR = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "*", "%": "//", "<<": ">>"}
OPERATOR |= {">>": "<<", "&": "|", "|": "&", "and": "or", "or": "and"}
MAX_CONSTANT = 10_000  # larger literals are sizes and masks, rarely an off-by-one site


@dataclass(frozen=True)
class Edit:
    """Replace ``source[start:end]`` (``old``) by ``new``; ``line`` is the 1-based line tests
    must execute for the edit to matter."""

    kind: EditKind
    path: str
    function: str
    line: int
    start: int
    end: int
    old: str
    new: str

    def apply(self, source: str) -> str:
        if source[self.start : self.end] != self.old:
            raise ValueError(f"{self.path}:{self.line}: the source changed under the edit")
        return source[: self.start] + self.new + source[self.end :]


class _Text:
    """Character offsets of (line, byte column) positions, and the file's tokens."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.tokens = [
            (self.offset_chars(t.start), self.offset_chars(t.end), t.string)
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type in (tokenize.OP, tokenize.NAME)
        ]
        self.token_starts = [t[0] for t in self.tokens]

    def offset_chars(self, pos: tuple[int, int]) -> int:
        return self.starts[pos[0] - 1] + pos[1]

    def offset(self, line: int, col_bytes: int) -> int:
        text = self.lines[line - 1].encode()[:col_bytes].decode()
        return self.starts[line - 1] + len(text)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def tokens_between(self, start: int, end: int) -> list[tuple[int, int, str]]:
        i = bisect.bisect_left(self.token_starts, start)
        out = []
        while i < len(self.tokens) and self.tokens[i][1] <= end:
            out.append(self.tokens[i])
            i += 1
        return out


class _Finder(ast.NodeVisitor):
    def __init__(self, text: _Text, path: str) -> None:
        self.text, self.path = text, path
        self.scope: list[str] = []
        self.depth = 0  # > 0 inside a function body
        self.found: list[Edit] = []

    # -- scopes: only function bodies are edited (defaults and decorators run at import)
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.depth += 1
        for stmt in node.body:
            self.visit(stmt)
        self.depth -= 1
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def _add(self, kind: EditKind, node: ast.AST, start: int, end: int, new: str) -> None:
        if self.depth:
            old = self.text.source[start:end]
            line = getattr(node, "lineno", 0)
            self.found.append(
                Edit(kind, self.path, ".".join(self.scope), line, start, end, old, new)
            )

    # -- the edits
    def visit_Compare(self, node: ast.Compare) -> None:
        left: ast.AST = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            words, new = COMPARE[type(op)]
            between = self.text.tokens_between(self.text.span(left)[1], self.text.span(right)[0])
            names = [t for t in between if t[2] not in "()"]
            if [t[2] for t in names] == list(words):
                self._add("flip_comparison", node, names[0][0], names[-1][1], new)
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        between = self.text.tokens_between(
            self.text.span(node.left)[1], self.text.span(node.right)[0]
        )
        ops = [t for t in between if t[2] not in "()"]
        if len(ops) == 1 and ops[0][2] in OPERATOR:
            self._add("flip_operator", node, ops[0][0], ops[0][1], OPERATOR[ops[0][2]])
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        between = self.text.tokens_between(
            self.text.span(node.target)[1], self.text.span(node.value)[0]
        )
        ops = [t for t in between if t[2].endswith("=")]
        if len(ops) == 1 and ops[0][2][:-1] in OPERATOR:
            new = OPERATOR[ops[0][2][:-1]] + "="
            self._add("flip_operator", node, ops[0][0], ops[0][1], new)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        word = "and" if isinstance(node.op, ast.And) else "or"
        for left, right in zip(node.values, node.values[1:], strict=False):
            between = self.text.tokens_between(self.text.span(left)[1], self.text.span(right)[0])
            ops = [t for t in between if t[2] == word]
            if len(ops) == 1:
                self._add("flip_operator", node, ops[0][0], ops[0][1], OPERATOR[word])
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        start, end = self.text.span(node)
        old = self.text.source[start:end]
        if isinstance(node.value, bool) and old in ("True", "False"):
            self._add("flip_boolean", node, start, end, "False" if node.value else "True")
        elif (
            type(node.value) is int
            and re.fullmatch(r"[0-9]+", old)
            and 0 <= node.value <= MAX_CONSTANT
        ):
            new = node.value - 1 if node.value > 0 else node.value + 1
            self._add("constant_shift", node, start, end, str(new))

    def _negate(self, test: ast.expr) -> None:
        start, end = self.text.span(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.text.span(test.operand)
            self._add("negate_condition", test, start, end, self.text.source[inner[0] : inner[1]])
        else:
            self._add("negate_condition", test, start, end, f"not ({self.text.source[start:end]})")

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self._drop(node)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def _drop(self, node: ast.If) -> None:
        """The whole ``if`` statement's lines, when it has no ``else``, is no ``elif``, owns its
        lines alone; whether its block keeps a statement is left to the parse check."""
        if node.orelse:
            return
        text, last = self.text, node.end_lineno or node.lineno
        first = text.lines[node.lineno - 1]
        head = first.encode()[: node.col_offset].decode()
        rest = text.lines[last - 1].encode()[node.end_col_offset or 0 :].decode()
        if head.strip() or not first[len(head) :].startswith("if") or rest.strip():
            return
        start, end = text.starts[node.lineno - 1], text.starts[last]
        self._add("drop_if", node, start, end, "")


def find_edits(path: str, source: str, check: bool = True) -> list[Edit]:
    """Every edit of ``source`` in source order that parses and changes its syntax tree;
    ``check=False``: unchecked (``Changes`` checks one at a time: a check parses the whole
    file, so checking every edit of a large module costs minutes where a few are tried)."""
    try:
        tree = ast.parse(source)
        finder = _Finder(_Text(source), path)
    except (SyntaxError, tokenize.TokenError, ValueError):
        return []
    finder.visit(tree)
    found = sorted(finder.found, key=lambda e: (e.start, e.end, e.kind, e.new))
    if not check:
        return found
    changes = Changes({path: source})
    return [e for e in found if changes(e)]


class Changes:
    """Whether an edit parses and changes the syntax tree of its file (``sources``: path ->
    text), each file's tree dumped once."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources
        self.dumps: dict[str, str] = {}

    def __call__(self, edit: Edit) -> bool:
        source = self.sources[edit.path]
        if edit.path not in self.dumps:
            self.dumps[edit.path] = ast.dump(ast.parse(source))
        try:
            return ast.dump(ast.parse(edit.apply(source))) != self.dumps[edit.path]
        except (SyntaxError, ValueError):
            return False
