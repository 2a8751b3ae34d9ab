"""Planted tests: evidence of a verification run that the test process cannot give on its own word.

Each verification appends a few tests of its own to the task's test files (``plant``): canaries,
whose bodies fail an assertion, and controls, whose bodies pass; every one of them first writes a
per-run token to a marker file of its own. The run's ids and theirs are given to pytest mixed at
random positions (``mix``). The witness process of the bootstrap (``verify_boot.py``: the parent of
the test process, where no code of the workspace runs) reads which markers hold their token after
the test process ended; the marker paths and tokens reach it through the secret file, never
through the test process's argv. ``check`` then decides:

- a canary reported passing: the harness reports passes whatever the tests do (a hook replaced,
  failures counted as passes, a forged stream): tampering;
- a control reported passing whose marker is missing: no test body ran (the run-test-call hook
  replaced): tampering;
- a canary whose body never ran, a control that did not pass: the run cannot pass (a collection
  error of the test file, or code that broke ``open``), but nothing shows a forgery.

What candidate code cannot know beforehand: the planted tests' names (drawn per run from the names
of the file's own tests, a number or a word changed), their files, their positions among the ids,
their bodies (expressions and values drawn per run, canaries and controls from the same shapes), the
marker paths and tokens. What it can still do: inspect the collected tests while they run (read
each planted test's code and replay it, or report only the planted ones honestly); that needs
harness reach the tamper screen flags (``gagar.grader.screen``), and docs/security.md lists it
under "What remains". Pure, given ``rng``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

WORDS = (
    "basic edge empty large small mixed zero one many order again twice nested single simple "
    "negative unicode long short repeat default other extra sorted swap"
).split()
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def (test\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Planted:
    """One planted test: its node id, whether it must fail, and its marker file and token."""

    nodeid: str
    canary: bool
    marker: str
    token: str


@dataclass(frozen=True)
class Planting:
    """The planted tests of one run and the test files with them appended."""

    tests: tuple[Planted, ...] = ()
    files: dict[str, bytes] = field(default_factory=dict)

    def markers(self) -> dict[str, str]:
        return {p.marker: p.token for p in self.tests}

    def expected_exit(self) -> int:
        """pytest's status of an honest run: 1 (tests failed) where canaries were planted."""
        return 1 if any(p.canary for p in self.tests) else 0

    def describe(self) -> str:
        canaries = [p.nodeid for p in self.tests if p.canary]
        controls = [p.nodeid for p in self.tests if not p.canary]
        return (
            f"{len(self.tests)} tests were planted by gagar beside the task's: canaries, which must "
            f"fail ({', '.join(canaries)}; their failures in the log are expected), and controls, "
            f"which must pass ({', '.join(controls)})"
        )


def _value(rng: random.Random) -> tuple[str, object]:
    """An expression in the style of a test's ``assert f(...) == value`` and its value."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    word = rng.choice(WORDS)
    shapes: list[tuple[str, object]] = [
        (f"sum([{a}, {b}, {c}])", a + b + c),
        (f"max({a}, {b}) - min({a}, {b})", abs(a - b)),
        (f"len({word!r} * {c})", len(word) * c),
        (f"sorted([{a}, {b}, {c}])[1]", sorted([a, b, c])[1]),
        (f"{a} * {b} % {c + 2}", a * b % (c + 2)),
        (f"{word!r}.upper()[{c % len(word)}:]", word.upper()[c % len(word) :]),
        (f"divmod({a * b}, {c})", divmod(a * b, c)),
    ]
    return rng.choice(shapes)


def _wrong(value: object, rng: random.Random) -> object:
    if isinstance(value, int):
        return value + rng.choice([-3, -2, -1, 1, 2, 3])
    if isinstance(value, str):
        return value + rng.choice(WORDS)[:2]
    if isinstance(value, tuple):
        return (value[0], value[1] + 1)
    raise TypeError(type(value))


def _source(name: str, planted: Planted, rng: random.Random) -> str:
    expr, value = _value(rng)
    expected = _wrong(value, rng) if planted.canary else value
    var, handle = rng.choice(["result", "got", "value", "out"]), rng.choice(["f", "fh", "out_"])
    if var == handle:
        handle += "_"
    return (
        f"\n\ndef {name}():\n"
        f"    {var} = {expr}\n"
        f"    with open({planted.marker!r}, 'w') as {handle}:\n"
        f"        {handle}.write({planted.token!r})\n"
        f"    assert {var} == {expected!r}\n"
    )


def _name(text: str, added: str, taken: set[str], rng: random.Random) -> str:
    """A name like the file's own tests' (``test_gcd_0`` -> ``test_gcd_4`` or ``test_gcd_swap``),
    in neither ``text`` nor what was ``added`` to it."""
    own = _DEF.findall(text)
    for _ in range(1000):
        stem = re.sub(r"(_\d+)+$", "", rng.choice(own)) or "test"
        tail = str(rng.randint(0, 20)) if rng.random() < 0.6 else rng.choice(WORDS)
        name = f"{stem}_{tail}"
        if name not in taken and not re.search(rf"\b{name}\b", text + added):
            taken.add(name)
            return name
    raise RuntimeError("no free test name")  # not with 1000 draws over 21 numbers and 24 words


def plant(
    test_ids: Sequence[str],
    pristine: Mapping[str, bytes],
    rng: random.Random,
    canaries: int | None = None,
    controls: int | None = None,
) -> Planting:
    """Append ``canaries`` and ``controls`` tests (each 1 or 2, drawn, where not given) to the test
    files of ``test_ids`` (their text in ``pristine``), each in a file drawn at random; only files
    of Python source whose own tests are named ``test*`` (so that pytest collects the planted
    ones), else nothing is planted. One of each is enough against a forgery of every outcome; a
    drawn count leaves code that counts failures guessing (each canary's failure report costs
    some 10 ms of CPU: bench/verify_cost.py)."""
    files = sorted(
        {
            tid.split("::")[0]
            for tid in test_ids
            if tid.split("::")[0].endswith(".py") and tid.split("::")[0] in pristine
        }
    )
    texts: dict[str, str] = {}
    for path in files:
        try:
            text = pristine[path].decode()
        except UnicodeDecodeError:
            continue
        if _DEF.search(text):  # its tests are named test*: pytest collects a planted test*
            texts[path] = text
    if not texts:
        return Planting()
    canaries = rng.choice([1, 2]) if canaries is None else canaries
    controls = rng.choice([1, 2]) if controls is None else controls
    kinds = [True] * canaries + [False] * controls
    rng.shuffle(kinds)
    taken: set[str] = set()
    tests, added = [], dict.fromkeys(texts, "")
    for canary in kinds:
        path = rng.choice(sorted(texts))
        name = _name(texts[path], added[path], taken, rng)
        p = Planted(
            nodeid=f"{path}::{name}",
            canary=canary,
            marker=f"/tmp/{rng.getrandbits(128):032x}",
            token=f"{rng.getrandbits(128):032x}",
        )
        added[path] += _source(name, p, rng)
        tests.append(p)
    out = {p: (texts[p].rstrip("\n") + "\n" + a).encode() for p, a in added.items() if a}
    return Planting(tests=tuple(tests), files=out)


def mix(test_ids: Sequence[str], planting: Planting, rng: random.Random) -> list[str]:
    """The task's ids in their order, the planted ones put in at random positions."""
    ids = list(test_ids)
    for p in planting.tests:
        ids.insert(rng.randint(0, len(ids)), p.nodeid)
    return ids


def check(
    planting: Planting, outcomes: Mapping[str, object], markers: Mapping[str, object]
) -> tuple[list[str], list[str]]:
    """(tampering, broken): what the planted tests show forged, and why else the run cannot
    pass. ``outcomes``: node id -> True when reported passing; ``markers``: marker path -> True
    when it held its token after the run (the witness's, never the test process's, word)."""
    tampering, broken = [], []
    for p in planting.tests:
        passed, ran = outcomes.get(p.nodeid) is True, markers.get(p.marker) is True
        name = PurePosixPath(p.nodeid.split("::")[0]).name + "::" + p.nodeid.split("::")[-1]
        if p.canary and passed:
            tampering.append(
                f"planted canary {name} (its body fails an assertion) was reported passing"
                + ("" if ran else ", and its body never ran")
            )
        elif not p.canary and passed and not ran:
            tampering.append(f"planted control {name} was reported passing, but its body never ran")
        elif p.canary and not ran:
            broken.append(f"planted canary {name} never ran its body")
        elif not p.canary and not passed:
            broken.append(f"planted control {name} did not pass")
    return tampering, broken
