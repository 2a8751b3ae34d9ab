"""Every bench result JSON carries the machine record (issue 44): the CPU model and its vector
units, so a number from an AVX2-only EPYC is never read as one from an AMX machine.

Statically: every JSON a bench writes goes through ``bench.record.save``, except the files named
in ``NOT_RESULTS``; and every bench script can still import it when run as
``python bench/x.py``. Dynamically: ``save`` writes the record and keeps the bench's own keys.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import record  # noqa: E402
from gagar import machine as machine_mod  # noqa: E402

BENCH = ROOT / "bench"
NOT_SCRIPTS = {"record.py", "stats.py"}  # the writer itself, and a library of statistics
WRITERS = {"write_text", "write", "write_bytes"}

# JSON writes that are not a bench's result, by (file, enclosing function, what is written to).
# Each has a reason; a result written by one of these functions elsewhere still has to use save.
NOT_RESULTS = {
    # rank 0 hands its rows to the parent process, which saves them in the result
    ("checkpoint.py", "_worker", "Path(tmp, f'rows{world}.json')"),
    # rank 0 hands its timings to the parent process, which saves them in the result
    ("model.py", "_measure", "Path(out)"),
    # the recorded groups (data, not measurements) in --work; the result is --json, via save
    ("gagar_replay.py", "main", "fh"),
    # the recorded replay groups (data the analysis reads back, machine-independent); the
    # analysis's result is --out, via save
    ("replay_noise.py", "write_replay", "fh"),
    # --finish rewrites a result that save wrote, keeping the machine record of the run that
    # measured it (save would stamp the machine that merely rewrote the tables)
    ("gagar_vs_grpo.py", "finish", "out_json"),
}


def _is_json_call(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "json"
    )


def _not_a_write(node: ast.Call, parents: list[ast.AST]) -> bool:
    """``json.dumps`` that writes nothing: a deep copy (``json.loads(json.dumps(x))``), a
    subprocess's stdin (``input=json.dumps(x)``) or bytes for a hash (``json.dumps(x).encode()``
    outside any write)."""
    parent = parents[-1]
    if _is_json_call(parent, "loads"):
        return True
    if isinstance(parent, ast.keyword) and parent.arg == "input":
        return True
    return (
        isinstance(parent, ast.Attribute)
        and parent.attr == "encode"
        and not any(_write_call(p) for p in parents)
    )


def _write_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WRITERS
    )


def _target(node: ast.Call, parents: list[ast.AST]) -> str:
    """What the JSON is written to: ``json.dump``'s file, or the receiver of the write call the
    ``json.dumps`` sits in ("?" where it is kept in a variable first: a site all the same)."""
    if node.func.attr == "dump":  # type: ignore[attr-defined]
        return ast.unparse(node.args[1]) if len(node.args) > 1 else "?"
    for p in reversed(parents):
        if _write_call(p):
            return ast.unparse(p.func.value)  # type: ignore[attr-defined]
    return "?"


def json_writes(path: Path) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, target, line) of every JSON a bench file writes."""
    sites = []

    def visit(node: ast.AST, parents: list[ast.AST], func: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func = node.name
        if (_is_json_call(node, "dump") or _is_json_call(node, "dumps")) and not (
            node.func.attr == "dumps" and _not_a_write(node, parents)  # type: ignore[attr-defined]
        ):
            sites.append((path.name, func, _target(node, parents), node.lineno))  # type: ignore[arg-type]
        for child in ast.iter_child_nodes(node):
            visit(child, [*parents, node], func)

    visit(ast.parse(path.read_text()), [], "<module>")
    return sites


def bench_scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name not in NOT_SCRIPTS)


def test_every_bench_result_goes_through_save() -> None:
    sites = [s for p in bench_scripts() for s in json_writes(p)]
    unrecorded = [s for s in sites if s[:3] not in NOT_RESULTS]
    assert not unrecorded, (
        "a bench writes JSON without bench.record.save (no machine record); route it through "
        f"save, or add it to NOT_RESULTS with the reason it is not a result: {unrecorded}"
    )
    stale = NOT_RESULTS - {s[:3] for s in sites}
    assert not stale, f"NOT_RESULTS names writes that no longer exist: {stale}"


def test_every_bench_script_calls_save() -> None:
    def calls_save(path: Path) -> bool:
        return any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "save"
            for n in ast.walk(ast.parse(path.read_text()))
        )

    assert [p.name for p in bench_scripts() if not calls_save(p)] == []


def _is_path_insert(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and ast.unparse(stmt.value.func) == "sys.path.insert"
    )


@pytest.mark.parametrize("path", bench_scripts(), ids=lambda p: p.name)
def test_save_is_importable_when_run_as_a_script(path: Path) -> None:
    """``python bench/x.py`` puts bench/, not the repository, on sys.path: the repository has to
    be inserted before ``from bench.record import save``."""
    body = ast.parse(path.read_text()).body
    imports = [
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.ImportFrom) and s.module == "bench.record"
    ]
    inserts = [i for i, s in enumerate(body) if _is_path_insert(s)]
    assert imports, f"{path.name} does not import bench.record at module level"
    assert inserts and inserts[0] < imports[0], f"{path.name}: sys.path.insert(0, ROOT) first"


@pytest.fixture
def epyc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU as /proc/cpuinfo shows a Zen 3 EPYC: AVX2, no AVX-512, no AMX."""
    cpuinfo = {"model name": "AMD EPYC 7B13", "flags": "fpu sse4_2 avx avx2 fma f16c"}
    monkeypatch.setattr(machine_mod, "_cpuinfo", lambda: cpuinfo)


def test_save_writes_the_cpu_model_and_its_vector_units(epyc: None, tmp_path: Path) -> None:
    out = tmp_path / "results" / "x.json"  # the folder does not exist yet
    result = {"rows": [1, 2], "load_average": [1.0, 2.0, 3.0]}
    written = record.save(out, result, indent=2)
    data = json.loads(out.read_text())
    assert data == written
    assert data["machine"]["cpu"] == "AMD EPYC 7B13"
    assert data["machine"]["vector_units"] == ["sse4_2", "avx", "avx2", "fma", "f16c"]
    assert set(machine_mod.machine()) <= set(data["machine"])
    assert data["rows"] == [1, 2] and data["load_average"] == [1.0, 2.0, 3.0]
    assert "machine" not in result, "the bench's dict is left as it was"


def test_save_keeps_what_the_bench_measured_about_the_machine(epyc: None, tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    record.save(out, {"machine": {"loadavg": [5.0, 4.0, 3.0], "cpu": "a guess"}}, default=str)
    data = json.loads(out.read_text())
    assert data["machine"]["loadavg"] == [5.0, 4.0, 3.0]
    assert data["machine"]["cpu"] == "AMD EPYC 7B13", "the record wins over a bench's guess"
    record.save(out, {"machine": "Linux-6.1-x86_64"})  # the old platform string: replaced
    assert json.loads(out.read_text())["machine"]["cpu"] == "AMD EPYC 7B13"
