"""Which commands the warm test runner (``warm.py``) takes: Python commands without shell syntax.

``parse`` turns ``[env] [VAR=value ...] python[3] [-I] [-B] (-m MODULE | -c CODE | SCRIPT) [ARGS]``
(a string without shell syntax, or an argv) into a ``Request`` the fork server runs; anything else,
and any assignment the interpreter or the loader would read at its start (``LD_*``, and without
``-I`` every ``PYTHON*`` but ``PYTHONPATH``), gives None: the command runs cold. Pure.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence

PYTHONS = ("python", "python3")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SHELL_SPECIAL = frozenset("$`;&|<>()*?[]{}~#!\\\n\r")


@dataclasses.dataclass(frozen=True)
class Request:
    """A Python command the warm runner can run: ``python -m MODULE``/``-c CODE``/``SCRIPT``."""

    kind: str  # "module", "code" or "script"
    target: str  # the module's name, the code, the script's path
    args: list[str]
    env: dict[str, str]  # the command's ``VAR=value`` assignments
    python: str  # the interpreter's name as the command gives it
    isolated: bool = False  # ``-I``: neither the working directory nor PYTHONPATH on sys.path


def _words(cmd: str | Sequence[str]) -> list[str] | None:
    """The words of a string command, or None where the shell would do more than split it."""
    if not isinstance(cmd, str):
        return list(cmd)
    quote = ""
    for ch in cmd:
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif quote == '"':
            if ch in "$`\\":
                return None
            quote = "" if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _SHELL_SPECIAL:
            return None
    try:
        return shlex.split(cmd)
    except ValueError:
        return None


def parse(cmd: str | Sequence[str]) -> Request | None:
    """The ``Request`` for ``[env] [VAR=value ...] python[3] [-I] [-B] (-m MODULE | -c CODE |
    SCRIPT) [ARGS]`` (no other interpreter options: the server runs ``-I -B``, and ``-B`` is
    what it does anyway), else None: the command runs cold."""
    words = _words(cmd)
    if words and words[0] == "env":
        words.pop(0)
    if not words:
        return None
    env: dict[str, str] = {}
    while words and _NAME.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words or words[0] not in PYTHONS:
        return None
    python, options = words[0], set()
    while len(words) > 1 and re.fullmatch(r"-[IB]+", words[1]):
        options |= set(words.pop(1)[1:])
    isolated = "I" in options
    for name in env:  # read by the interpreter (unless isolated) or the loader at start
        if name.startswith("LD_") or (
            name.startswith("PYTHON") and name != "PYTHONPATH" and not isolated
        ):
            return None
    if len(words) < 2:
        return None
    if words[1] in ("-m", "-c") and len(words) > 2 and words[2]:
        kind = "module" if words[1] == "-m" else "code"
        return Request(kind, words[2], words[3:], env, python, isolated)
    if words[1].startswith("-") or words[1] == "":
        return None
    return Request("script", words[1], words[2:], env, python, isolated)


__all__ = ["PYTHONS", "Request", "parse"]
