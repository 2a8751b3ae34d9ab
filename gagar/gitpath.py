"""File names in diff headers quoted as git quotes them (``core.quotePath``, git's
``quote_c_style``), pure.

A name the policy chose can hold a newline, a quote or bytes that are not ASCII; written raw into
``diff --git``/``---``/``+++`` lines it could add lines of its own to the patch a grader reads
(``"x\\n+++ b/README"``). Git's answer, kept here: such a name goes in double quotes, with C
escapes for the usual control characters and three-digit octal for every other byte below 0x20,
0x7f and every byte of a non-ASCII character. A name with a space stays bare, as in git, and a
``---``/``+++`` line whose name holds a space ends with a tab (quoted or not, as git's).
"""

from __future__ import annotations

_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}
_ESCAPES |= {ord('"'): '\\"', ord("\\"): "\\\\"}


def _needs_quotes(name: str) -> bool:
    return any(c in '"\\' or ord(c) < 0x20 or ord(c) >= 0x7F for c in name)


def quote(name: str) -> str:
    """``name`` as git writes it in a diff header: bare when plain, else C-quoted."""
    if not _needs_quotes(name):
        return name
    out = []
    for byte in name.encode("utf-8", "surrogateescape"):
        if byte in _ESCAPES:
            out.append(_ESCAPES[byte])
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return '"' + "".join(out) + '"'


def side(prefix: str, path: str | None) -> str:
    """One side of a diff header: ``/dev/null`` for a missing file, else ``prefix + path``
    quoted as a whole (git writes ``"a/x\\ny"``, not ``a/"x\\ny"``)."""
    return "/dev/null" if path is None else quote(prefix + path)


def file_line(prefix: str, path: str | None) -> str:
    """The name as it goes on a ``---``/``+++`` line: with git's trailing tab after a name that
    holds a space."""
    name = side(prefix, path)
    return name + "\t" if " " in name else name
