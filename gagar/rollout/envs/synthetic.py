"""The built-in synthetic family: small Python packages with one injected bug and hidden tests.

``generate(seed)`` is deterministic: the seed picks a package name, 1-2 modules of 2-3 functions
from ``catalog.TEMPLATES``, the function to break and one of its mutations (wrong operator,
off-by-one, wrong comparison, wrong variable, missing case). The agent sees the buggy package and
the tests that do not reveal the bug; the hidden test files hold every test. ``FAIL_TO_PASS`` are
the target's tests that fail on the buggy code; ``PASS_TO_PASS`` all the others.

Each task is checked when generated: the tests are evaluated in-process against the correct and
the buggy source (our own code, not the agent's: no sandbox needed), and generation fails loudly if
the reference does not pass everything or the bug reveals nothing. ``check_in_sandbox`` repeats
the check through the real verifier (used by the tests and by ``--verify`` style callers).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gagar.rollout.envs.catalog import TEMPLATES, Mutation, Template
from gagar.rollout.envs.task import PLAIN_PYTEST, Task, TaskError

PACKAGES = ("toolbox", "utilkit", "helpers", "corelib", "mathkit", "textkit", "common", "basics")
MODULES = ("numeric", "text", "seqs", "convert", "search", "stats", "core", "misc")


@dataclass(frozen=True)
class Plan:
    package: str
    modules: dict[str, tuple[Template, ...]]
    target: Template
    mutation: Mutation


def plan(seed: int) -> Plan:
    rng = random.Random(seed)
    package = rng.choice(PACKAGES)
    n_modules = rng.choice((1, 2))
    chosen = rng.sample(TEMPLATES, n_modules * rng.choice((2, 3)))
    names = rng.sample(MODULES, n_modules)
    per = len(chosen) // n_modules
    modules = {names[i]: tuple(chosen[i * per : (i + 1) * per]) for i in range(n_modules)}
    target = rng.choice(chosen)
    return Plan(package, modules, target, rng.choice(target.mutations))


def _module_source(
    templates: tuple[Template, ...], target: Template, mutation: Mutation, buggy: bool
) -> str:
    parts = []
    for t in templates:
        src = t.source.replace(mutation.old, mutation.new) if buggy and t is target else t.source
        parts.append(src.replace(":\n", f':\n    """Return {t.doc}."""\n', 1))
    return "\n\n".join(parts)


def _test_source(package: str, module: str, templates: tuple[Template, ...], skip: set[str]) -> str:
    names = ", ".join(t.name for t in templates)
    lines = [f"from {package}.{module} import {names}\n"]
    for t in templates:
        for i, body in enumerate(t.tests):
            test = f"test_{t.name}_{i}"
            if test in skip:
                continue
            indented = "\n".join("    " + ln for ln in body.splitlines())
            lines.append(f"\ndef {test}():\n{indented}\n")
    return "\n".join(lines)


def _run_tests(t: Template, source: str) -> list[bool]:
    """Evaluate ``t``'s tests in-process against ``source`` (catalog code only, never an agent's)."""
    ns: dict = {}
    exec(source, ns)
    results = []
    for body in t.tests:
        try:
            exec(body, dict(ns))
            results.append(True)
        except Exception:
            results.append(False)
    return results


def _show(expr: str, source: str) -> str:
    ns: dict = {}
    exec(source, ns)
    try:
        return repr(eval(expr, ns))
    except Exception as e:
        return f"raises {type(e).__name__}"


def _statement(p: Plan, module: str) -> str:
    t, buggy = p.target, p.target.source.replace(p.mutation.old, p.mutation.new)
    head = f"`{p.package}.{module}.{t.name}` should return {t.doc}, but it does not."
    for example in t.examples:
        want, got = _show(example, t.source), _show(example, buggy)
        if want != got:
            return f"{head}\n\nFor example, `{example}` should give `{want}`, but gives `{got}`.\n"
    return head + "\n"


def generate(seed: int) -> Task:
    """One synthetic task, the same for the same seed, checked before it is returned."""
    p = plan(seed)
    module = next(m for m, ts in p.modules.items() if p.target in ts)
    buggy = p.target.source.replace(p.mutation.old, p.mutation.new)
    if not all(_run_tests(p.target, p.target.source)):
        raise TaskError(f"seed {seed}: reference of {p.target.name} fails its own tests")
    outcome = _run_tests(p.target, buggy)
    failing = {f"test_{p.target.name}_{i}" for i, ok in enumerate(outcome) if not ok}
    if not failing:
        raise TaskError(f"seed {seed}: mutation {p.mutation} of {p.target.name} reveals nothing")
    files = {f"{p.package}/__init__.py": f'"""The {p.package} package."""\n'}
    hidden, reference, ids = {}, {}, []
    for mod, ts in p.modules.items():
        path = f"{p.package}/{mod}.py"
        files[path] = _module_source(ts, p.target, p.mutation, buggy=True)
        test_path = f"tests/test_{mod}.py"
        files[test_path] = _test_source(p.package, mod, ts, skip=failing)
        hidden[test_path] = _test_source(p.package, mod, ts, skip=set())
        ids += [f"{test_path}::test_{t.name}_{i}" for t in ts for i in range(len(t.tests))]
        if p.target in ts:
            reference[path] = _module_source(ts, p.target, p.mutation, buggy=False)
    files["README.md"] = (
        f"# {p.package}\n\nSmall utility functions. Run the tests with `python -m pytest`.\n"
    )
    f2p = [i for i in ids if i.rsplit("::", 1)[1] in failing]
    return Task(
        instance_id=f"synthetic-{seed}",
        repo=f"synthetic/{p.package}",
        family="synthetic",
        problem_statement=_statement(p, module),
        files=files,
        fail_to_pass=f2p,
        pass_to_pass=[i for i in ids if i not in f2p],
        test_files=hidden,
        test_command=PLAIN_PYTEST,
        reference_files=reference,
        metadata={"seed": seed, "function": p.target.name, "mutation_kind": p.mutation.kind},
    )


def generate_many(n: int, seed: int = 0) -> list[Task]:
    return [generate(seed + i) for i in range(n)]


def check_in_sandbox(task: Task, factory) -> tuple[bool, bool]:
    """(buggy repository fails, reference fix passes), both through the real verifier."""
    from gagar.rollout.envs.verify import verify_files

    before = verify_files(task, task.repo_files(), factory)
    after = verify_files(task, task.fixed_files(), factory)
    return (before.valid and not before.passed), (after.valid and after.passed)
