"""Function templates for the synthetic family: correct source, hidden tests, and injectable bugs.

Each mutation is an exact text replacement in the correct source, labelled with its kind. Every
(template, mutation) pair is checked to fail some hidden test, and the correct source to pass all,
by ``tests/unit/test_envs_synthetic.py`` (in-process) and, for generated tasks, in a sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MutationKind = Literal[
    "wrong_operator", "off_by_one", "wrong_comparison", "wrong_variable", "missing_case"
]


@dataclass(frozen=True)
class Mutation:
    kind: MutationKind
    old: str
    new: str


@dataclass(frozen=True)
class Template:
    name: str
    doc: str
    source: str
    tests: tuple[str, ...]  # each: assertion lines of one test function
    examples: tuple[str, ...]  # calls shown in problem statements
    mutations: tuple[Mutation, ...]


M = Mutation
T = Template

TEMPLATES: tuple[Template, ...] = (
    T(
        "clamp",
        "limit x to the closed interval [lo, hi]",
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
        (
            "assert clamp(5, 0, 10) == 5",
            "assert clamp(-3, 0, 10) == 0",
            "assert clamp(12, 0, 10) == 10\nassert clamp(10, 0, 10) == 10",
        ),
        ("clamp(-3, 0, 10)", "clamp(12, 0, 10)"),
        (
            M("wrong_comparison", "if x < lo:", "if x > lo:"),
            M("wrong_variable", "return hi\n", "return lo\n"),
            M("missing_case", "    if x > hi:\n        return hi\n", ""),
        ),
    ),
    T(
        "mean",
        "the arithmetic mean of xs, 0.0 for an empty list",
        "def mean(xs):\n    if not xs:\n        return 0.0\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n",
        (
            "assert mean([1, 2, 3]) == 2.0",
            "assert mean([]) == 0.0",
            "assert mean([4]) == 4.0\nassert mean([1, 2]) == 1.5",
        ),
        ("mean([1, 2, 3])", "mean([])"),
        (
            M("missing_case", "    if not xs:\n        return 0.0\n", ""),
            M("wrong_operator", "total += x", "total -= x"),
            M("off_by_one", "total / len(xs)", "total / (len(xs) + 1)"),
        ),
    ),
    T(
        "count_vowels",
        "how many characters of s are vowels (a, e, i, o, u; either case)",
        "def count_vowels(s):\n    count = 0\n    for ch in s.lower():\n        if ch in 'aeiou':\n            count += 1\n    return count\n",
        (
            "assert count_vowels('hello') == 2",
            "assert count_vowels('AEIOU') == 5",
            "assert count_vowels('xyz') == 0\nassert count_vowels('') == 0",
        ),
        ("count_vowels('AEIOU')", "count_vowels('hello')"),
        (
            M("wrong_variable", "for ch in s.lower():", "for ch in s:"),
            M("off_by_one", "count = 0\n", "count = 1\n"),
            M("wrong_comparison", "if ch in 'aeiou':", "if ch not in 'aeiou':"),
        ),
    ),
    T(
        "fizzbuzz",
        "'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for both, else str(n)",
        "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
        (
            "assert fizzbuzz(9) == 'Fizz'",
            "assert fizzbuzz(10) == 'Buzz'",
            "assert fizzbuzz(30) == 'FizzBuzz'",
            "assert fizzbuzz(7) == '7'",
        ),
        ("fizzbuzz(30)", "fizzbuzz(10)", "fizzbuzz(9)"),
        (
            M("missing_case", "    if n % 15 == 0:\n        return 'FizzBuzz'\n", ""),
            M("wrong_comparison", "if n % 5 == 0:", "if n % 5 != 0:"),
            M("wrong_operator", "if n % 3 == 0:", "if n // 3 == 0:"),
        ),
    ),
    T(
        "running_sum",
        "the list of prefix sums of xs",
        "def running_sum(xs):\n    out = []\n    acc = 0\n    for x in xs:\n        acc = acc + x\n        out.append(acc)\n    return out\n",
        (
            "assert running_sum([1, 2, 3]) == [1, 3, 6]",
            "assert running_sum([]) == []",
            "assert running_sum([5, -5, 5]) == [5, 0, 5]",
        ),
        ("running_sum([1, 2, 3])",),
        (
            M("wrong_operator", "acc = acc + x", "acc = acc * x"),
            M("wrong_variable", "out.append(acc)", "out.append(x)"),
        ),
    ),
    T(
        "is_palindrome",
        "whether s reads the same backwards, ignoring case and non-alphanumeric characters",
        "def is_palindrome(s):\n    cleaned = [c.lower() for c in s if c.isalnum()]\n    return cleaned == cleaned[::-1]\n",
        (
            "assert is_palindrome('A man, a plan, a canal: Panama')",
            "assert not is_palindrome('hello')",
            "assert is_palindrome('')\nassert is_palindrome('Aba')",
        ),
        ("is_palindrome('Aba')", "is_palindrome('hello')"),
        (
            M(
                "wrong_variable",
                "[c.lower() for c in s if c.isalnum()]",
                "[c for c in s if c.isalnum()]",
            ),
            M(
                "wrong_comparison",
                "return cleaned == cleaned[::-1]",
                "return cleaned != cleaned[::-1]",
            ),
        ),
    ),
    T(
        "dot",
        "the dot product of two equally long vectors",
        "def dot(a, b):\n    total = 0\n    for i in range(len(a)):\n        total += a[i] * b[i]\n    return total\n",
        (
            "assert dot([1, 2, 3], [4, 5, 6]) == 32",
            "assert dot([], []) == 0",
            "assert dot([2], [3]) == 6",
        ),
        ("dot([1, 2, 3], [4, 5, 6])", "dot([2], [3])"),
        (
            M("wrong_operator", "a[i] * b[i]", "a[i] + b[i]"),
            M("off_by_one", "range(len(a))", "range(len(a) - 1)"),
            M("wrong_variable", "a[i] * b[i]", "a[i] * a[i]"),
        ),
    ),
    T(
        "factorial",
        "n! for n >= 0",
        "def factorial(n):\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result\n",
        (
            "assert factorial(0) == 1",
            "assert factorial(5) == 120",
            "assert factorial(1) == 1\nassert factorial(3) == 6",
        ),
        ("factorial(5)",),
        (
            M("off_by_one", "range(2, n + 1)", "range(2, n)"),
            M("wrong_operator", "result *= k", "result += k"),
        ),
    ),
    T(
        "argmax",
        "the index of the first largest element of xs, -1 for an empty list",
        "def argmax(xs):\n    if not xs:\n        return -1\n    best = 0\n    for i in range(1, len(xs)):\n        if xs[i] > xs[best]:\n            best = i\n    return best\n",
        (
            "assert argmax([3, 9, 2]) == 1",
            "assert argmax([]) == -1",
            "assert argmax([5, 5, 1]) == 0\nassert argmax([1, 2, 7]) == 2",
        ),
        ("argmax([3, 9, 2])", "argmax([5, 5, 1])", "argmax([])"),
        (
            M("missing_case", "    if not xs:\n        return -1\n", ""),
            M("wrong_comparison", "if xs[i] > xs[best]:", "if xs[i] >= xs[best]:"),
            M("off_by_one", "range(1, len(xs))", "range(1, len(xs) - 1)"),
        ),
    ),
    T(
        "chunk",
        "xs split into consecutive lists of length size (the last may be shorter)",
        "def chunk(xs, size):\n    out = []\n    for start in range(0, len(xs), size):\n        out.append(xs[start:start + size])\n    return out\n",
        (
            "assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
            "assert chunk([], 3) == []",
            "assert chunk([1, 2], 5) == [[1, 2]]",
        ),
        ("chunk([1, 2, 3, 4, 5], 2)",),
        (
            M("off_by_one", "xs[start:start + size]", "xs[start:start + size - 1]"),
            M("wrong_variable", "range(0, len(xs), size)", "range(0, len(xs), 1)"),
        ),
    ),
    T(
        "to_fahrenheit",
        "degrees Celsius converted to Fahrenheit",
        "def to_fahrenheit(celsius):\n    return celsius * 9 / 5 + 32\n",
        (
            "assert to_fahrenheit(0) == 32",
            "assert to_fahrenheit(100) == 212",
            "assert to_fahrenheit(-40) == -40",
        ),
        ("to_fahrenheit(100)", "to_fahrenheit(0)"),
        (
            M("wrong_operator", "celsius * 9 / 5 + 32", "celsius * 9 / 5 - 32"),
            M("wrong_operator", "celsius * 9 / 5", "celsius * 5 / 9"),
        ),
    ),
    T(
        "binary_search",
        "the index of target in the sorted list xs, or -1 when it is absent",
        "def binary_search(xs, target):\n    lo, hi = 0, len(xs) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n        if xs[mid] == target:\n            return mid\n        if xs[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
        (
            "assert binary_search([1, 3, 5, 7], 5) == 2",
            "assert binary_search([1, 3, 5, 7], 4) == -1",
            "assert binary_search([1, 3, 5, 7], 7) == 3\nassert binary_search([2], 2) == 0",
            "assert binary_search([], 1) == -1",
        ),
        ("binary_search([1, 3, 5, 7], 7)", "binary_search([2], 2)"),
        (
            M("wrong_comparison", "while lo <= hi:", "while lo < hi:"),
            M("off_by_one", "lo, hi = 0, len(xs) - 1", "lo, hi = 0, len(xs) - 2"),
        ),
    ),
    T(
        "word_count",
        "a dict mapping each whitespace-separated, lower-cased word of text to its count",
        "def word_count(text):\n    counts = {}\n    for word in text.lower().split():\n        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
        (
            "assert word_count('a b a') == {'a': 2, 'b': 1}",
            "assert word_count('') == {}",
            "assert word_count('The the') == {'the': 2}",
        ),
        ("word_count('a b a')", "word_count('The the')"),
        (
            M("off_by_one", "counts.get(word, 0) + 1", "counts.get(word, 1) + 1"),
            M("wrong_variable", "text.lower().split()", "text.split()"),
        ),
    ),
    T(
        "gcd",
        "the greatest common divisor of two non-negative integers",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        ("assert gcd(12, 18) == 6", "assert gcd(7, 0) == 7", "assert gcd(17, 5) == 1"),
        ("gcd(12, 18)",),
        (M("wrong_variable", "return a\n", "return b\n"), M("wrong_operator", "a % b", "a // b")),
    ),
)
