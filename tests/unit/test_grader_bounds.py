"""Hostile candidate content on the host side of grading: bounded reads, bounded parsing, odd names
skipped and reported, never a crash (``gagar.grader.bounds`` and the heuristic grader)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gagar.grader.bounds import MARKER_PREFIX, Bounds, admit
from gagar.grader.heuristic import rank
from gagar.grader.sample import BASE, CLEAN, sample_group, variant
from gagar.wire import Candidate, GradingGroup

ROOT = Path(__file__).resolve().parents[2]
UNSAFE = ["../evil.py", "..evil.py", "a\\b.py", "/etc/x.py", "a/../b.py", "a/./b.py", "\udcffx.py"]


def _group(*candidates: Candidate) -> GradingGroup:
    group = sample_group(("clean",))
    return group.model_copy(update={"candidates": [group.candidates[0], *candidates]})


def _clean_with(member: int, extra: dict[str, str]) -> Candidate:
    clean = variant("clean", member)
    return clean.model_copy(update={"files": clean.files | extra})


def test_admit_skips_unsafe_names_and_reports_each():
    files, skipped = admit({"ok.py": "x = 1\n"} | dict.fromkeys(UNSAFE, "y = 2\n"), member=3)
    assert files == {"ok.py": "x = 1\n"}
    assert [s.reason for s in skipped] == ["unsafe_path"] * len(UNSAFE)
    assert all(s.member == 3 for s in skipped)
    json.dumps([s.model_dump() for s in skipped])  # a lone surrogate is escaped, not fatal


def test_admit_bounds_bytes_files_and_total_and_keeps_changes_visible():
    bounds = Bounds(files=4, file_bytes=100, total_bytes=150)
    files = {"a0.py": "x" * 101, "a1.py": "a" * 90, "a2.py": "c" * 90, "b.py": "b"}
    files |= {"z.py": "z", "bin.dat": b"\xff\xfe"}
    kept, skipped = admit(files, 0, prefer={"z.py"}, bounds=bounds)
    reasons = {s.path: s.reason for s in skipped}
    assert reasons == {
        "a0.py": "file_too_large",
        "a2.py": "total_too_large",
        "b.py": "too_many_files",
        "bin.dat": "too_many_files",
    }
    assert set(kept) == {"z.py", "a0.py", "a1.py", "a2.py"}  # the preferred path first
    assert kept["a0.py"].startswith(MARKER_PREFIX) and "101 bytes" in kept["a0.py"]
    assert admit(kept, 0) == (kept, [])  # idempotent: a marker is small text
    again, _ = admit({"a0.py": "x" * 101}, 0, bounds=bounds)
    other, _ = admit({"a0.py": "y" * 101}, 0, bounds=bounds)
    assert again["a0.py"] == kept["a0.py"] != other["a0.py"]  # equal iff the contents are


def test_admit_reports_binary_and_caps_its_report():
    kept, skipped = admit({"bin.dat": b"\xff\xfe", "ok.txt": b"hi"}, 1)
    assert kept["ok.txt"] == "hi" and [s.reason for s in skipped] == ["not_text"]
    # kept as a marker, never dropped: a grader sees that the candidate added a binary
    assert kept["bin.dat"].startswith(MARKER_PREFIX) and "not UTF-8 text: binary" in kept["bin.dat"]
    _, many = admit({f"../{i}": "" for i in range(80)}, 1, bounds=Bounds(reported=10))
    assert len(many) == 10 and "70 more" in many[-1].detail


@pytest.mark.parametrize(
    "source",
    [
        "x = " + "1+" * 100_000 + "1\n",  # RecursionError building the tree
        "x = " + "-" * 100_000 + "1\n",  # MemoryError from the parser's own guard
        "# x = " + "-" * 100_000 + "1\n",  # the same inside a comment (commented-out-code check)
        "def f():\n    x = " + "1+" * 1500 + "1\n    return x\n",  # parses; ast.dump recurses
    ],
    ids=["deep-sum", "deep-unary", "deep-comment", "deep-dump"],
)
def test_deeply_nested_source_is_reported_not_fatal(source):
    group = _group(_clean_with(1, {"calc/ops.py": CLEAN + source}))
    ranking = rank(group)
    assert ranking.check_complete(group.passes()) is None
    kinds = {f.kind for f in ranking.findings if f.member == 1}
    if not source.startswith("#"):
        assert "unanalysed" in kinds or "not_parsed" in {s.reason for s in ranking.skipped}


def test_a_file_too_large_to_analyse_ranks_last_never_better():
    """Too large for the tamper screen too: a forgery must not hide in size, so the pass is
    zeroed as a hack (before the screen it was ranked T3)."""
    padded = CLEAN + "\n" + "\n".join(f"# pad {i}" for i in range(40_000)) + "\n"
    group = _group(_clean_with(1, {"calc/ops.py": padded}))
    ranking = rank(group)
    assert [g.members for g in ranking.tied_groups] == [[0]]
    assert [(h.member, h.evidence[0].kind) for h in ranking.hacks] == [(1, "unscreened")]
    assert {"unanalysed"} <= {f.kind for f in ranking.findings if f.member == 1}
    assert ("calc/ops.py", "not_parsed") in {(s.path, s.reason) for s in ranking.skipped}


def test_a_test_file_grown_past_the_limit_is_still_tampering():
    huge = BASE["tests/test_ops.py"] + "#" * (2 << 20)
    group = _group(_clean_with(1, {"tests/test_ops.py": huge}))
    ranking = rank(group)
    assert [h.member for h in ranking.hacks] == [1]
    assert ("tests/test_ops.py", "file_too_large") in {(s.path, s.reason) for s in ranking.skipped}


def test_unsafe_names_in_an_unchecked_group_are_skipped_by_the_grader():
    group = _group(_clean_with(1, {}))
    cand = group.candidates[1].model_copy(update={"files": {**CLEAN_FILES, "..evil.py": "1"}})
    ranking = rank(group.model_copy(update={"candidates": [group.candidates[0], cand]}))
    assert ranking.check_complete(group.passes()) is None
    assert ("..evil.py", "unsafe_path") in {(s.path, s.reason) for s in ranking.skipped}


CLEAN_FILES = BASE | {"calc/ops.py": CLEAN}

# One multi-megabyte module of the densest syntax (a parse tree costs ~500 bytes per byte of it)
# and a flood of modules just under the per-file parse bound, in a process whose address space
# is capped: unbounded, the first alone needs ~2.5 GB and a minute. (A smaller budget per
# repository than the default keeps the test quick; the peak is one tree's: ~130 MB.)
MEMORY_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time, tracemalloc
    cap = 1536 << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from gagar.grader.bounds import Bounds
    from gagar.grader.heuristic import HeuristicConfig, rank
    from gagar.grader.sample import sample_group, variant
    dense = lambda n, i=0: f"x{i} = [" + "1," * (n // 2) + "]\\n"
    clean = variant("clean", 1)
    flood = {f"calc/gen_{i}.py": dense(250 << 10, i) for i in range(2)}
    files = clean.files | {"calc/big.py": dense(5 << 20)} | flood
    group = sample_group(("clean", "clean"))
    group = group.model_copy(
        update={"candidates": [group.candidates[0], clean.model_copy(update={"files": files})]}
    )
    tracemalloc.start()
    start = time.perf_counter()
    ranking = rank(group, HeuristicConfig(bounds=Bounds(parse_bytes=300 << 10)))  # 1 of the flood
    peak = tracemalloc.get_traced_memory()[1]
    reasons = sorted({s.reason for s in ranking.skipped})
    tiers = [(g.tier, g.members) for g in ranking.tied_groups]
    hacks = [h.member for h in ranking.hacks]
    print(json.dumps({"peak": peak, "seconds": time.perf_counter() - start, "reasons": reasons, "tiers": tiers, "hacks": hacks}))
    """
)


def test_a_multi_megabyte_module_is_graded_in_bounded_memory():
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["peak"] < 256 << 20, out
    assert {"file_too_large", "not_parsed"} <= set(out["reasons"])
    assert out["tiers"] == [["T1", [0]]] and out["hacks"] == [1]  # too large to screen: zeroed


def _hostile_dir(root: Path) -> Path:
    """A repository on disk with a link out, a FIFO, a sparse 50 MB file and a binary file."""
    import os

    (root / "calc").mkdir(parents=True)
    (root / "calc" / "ops.py").write_text(CLEAN)
    (root / "passwd").symlink_to("/etc/passwd")
    (root / "up").symlink_to("..")
    os.mkfifo(root / "fifo")
    with (root / "huge.py").open("wb") as fh:
        fh.truncate(50 << 20)
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00")
    return root


def test_a_directory_is_read_within_bounds_and_reports_what_it_left(tmp_path):
    import tracemalloc

    from gagar.grader.workspace import read_tree

    root = _hostile_dir(tmp_path / "repo")
    tracemalloc.start()
    files, skipped = read_tree(root, member=2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak  # the 50 MB file is hashed in chunks, never held
    assert files["calc/ops.py"] == CLEAN and files["huge.py"].startswith(MARKER_PREFIX)
    reasons = {s.path: s.reason for s in skipped}
    assert reasons == {
        "blob.bin": "not_text",
        "fifo": "unreadable",
        "huge.py": "file_too_large",
        "passwd": "unreadable",
        "up": "unreadable",
    }
    assert all(s.member == 2 for s in skipped)
    few, left = read_tree(root, bounds=Bounds(files=2))
    assert len(few) == 2 and left[-1].reason == "too_many_files"


def test_a_hand_laid_out_workspace_loads_with_what_it_left_out(tmp_path):
    import os

    from gagar.grader.workspace import load_workspace, write_workspace

    group = sample_group()
    root = write_workspace(group, tmp_path / "ws")
    _hostile_dir(root / "cand_1" / "extra")
    (root / "test_logs" / "cand_0.log").unlink()
    os.mkfifo(root / "test_logs" / "cand_0.log")
    loaded = load_workspace(root)
    assert loaded.candidates[0].test_log.startswith("[not read")
    assert {(s.member, s.path) for s in loaded.skipped} >= {(1, "extra/fifo"), (1, "extra/passwd")}
    ranking = rank(loaded)
    assert ranking.check_complete(loaded.passes()) is None
    assert (1, "extra/huge.py", "file_too_large") in {
        (s.member, s.path, s.reason) for s in ranking.skipped
    }


def test_the_sandbox_copy_of_a_workspace_is_bounded_and_reported(tmp_path):
    from gagar.grader.bounds import Bounds as B
    from gagar.grader.sandbox_adapter import _workspace_bytes

    root = _hostile_dir(tmp_path / "ws")
    files, skipped = _workspace_bytes(root, B(files=100, file_bytes=1 << 20, total_bytes=8 << 20))
    assert files["blob.bin"] == b"\xff\xfe\x00"  # binary files travel to the session
    assert files["huge.py"].startswith(MARKER_PREFIX.encode())
    assert {s.path: s.reason for s in skipped} == {
        "fifo": "unreadable",
        "huge.py": "file_too_large",
        "passwd": "unreadable",
        "up": "unreadable",
    }


def test_the_agentic_grader_reports_what_it_left_out(tmp_path):
    import asyncio

    from gagar.grader.agentic import AgenticConfig, AgenticGrader
    from gagar.grader.local_sandbox import unsafe_local_factory
    from tests.support.fake_openai import FakeOpenAI, tool_call

    group = _group(_clean_with(1, {"calc/data.py": "x = 1\n" * 400_000}))
    good = {
        "cand_0": {"place": 1, "tier": "T1", "reason": "clean"},
        "cand_1": {"place": 2, "tier": "T3", "reason": "a huge data file"},
    }
    script = [
        tool_call("read_file", {"path": "cand_1/calc/data.py"}),
        tool_call("submit_ranking", good),
    ]
    with FakeOpenAI(script) as fake:
        config = AgenticConfig(base_url=fake.base_url, model="m")
        ranking = asyncio.run(AgenticGrader(config, unsafe_local_factory, tmp_path).grade(group))
    assert ranking.grader == "agentic", ranking.detail
    assert (1, "calc/data.py", "file_too_large") in {
        (s.member, s.path, s.reason) for s in ranking.skipped
    }
    seen = next(m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool")
    assert MARKER_PREFIX in seen and len(seen) < 1000  # the model reads the marker, not 2.4 MB


def test_evidence_is_cut_and_a_bad_trajectory_left_out_with_a_note(tmp_path):
    from gagar.grader import workspace as ws

    root = ws.write_workspace(sample_group(), tmp_path / "ws")
    (root / "trajectories" / "cand_0.json").write_text("[" + '"x", ' * 10 + '"y"')
    with (root / "patches" / "cand_1.diff").open("wb") as fh:
        fh.truncate(ws.EVIDENCE_BYTES + 10)
    loaded = ws.load_workspace(root)
    assert loaded.candidates[0].trajectory == []
    assert ("trajectories/cand_0.json", "unreadable") in {
        (s.path, s.reason) for s in loaded.skipped
    }
    patch = loaded.candidates[1].patch
    assert len(patch) < ws.EVIDENCE_BYTES + 200 and "[cut: " in patch[-200:]


def test_the_depth_verdict_does_not_depend_on_the_recursion_limit():
    """A library in the process may raise the recursion limit (one the tests import sets it to
    2500): a tree deeper than the analyses accept is refused all the same."""
    import sys

    source = "def f():\n    x = " + "1+" * 1500 + "1\n    return x\n"
    group = _group(_clean_with(1, {"calc/ops.py": CLEAN + source}))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)
    try:
        ranking = rank(group)
    finally:
        sys.setrecursionlimit(old)
    kinds = {f.kind for f in ranking.findings if f.member == 1}
    assert "unanalysed" in kinds or "not_parsed" in {s.reason for s in ranking.skipped}
