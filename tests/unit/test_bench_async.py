"""bench/async.py's baseline: today's run.json fitted to an older checkout's spec."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_async", ROOT / "bench" / "async.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

OLD_SPEC = """
from pydantic import BaseModel, ConfigDict

class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")

class Rollout(_M):
    replicas: int = 1

class Spec(_M):
    rollout: Rollout

class GagarRun(_M):
    kind: str
    spec: Spec
"""


def test_fields_an_older_checkout_does_not_know_are_dropped_and_reported(tmp_path: Path) -> None:
    (tmp_path / "gagar").mkdir()
    (tmp_path / "gagar" / "__init__.py").write_text("")
    (tmp_path / "gagar" / "spec.py").write_text(textwrap.dedent(OLD_SPEC))
    doc = {
        "kind": "GagarRun",
        "spec": {"rollout": {"replicas": 2, "maxStaleness": 0, "shmSize": "8Gi"}, "newBlock": {}},
    }
    fitted, dropped = bench.fit_to_checkout(doc, tmp_path)
    assert fitted == {"kind": "GagarRun", "spec": {"rollout": {"replicas": 2}}}
    assert sorted(map(tuple, dropped)) == [
        ("spec.newBlock", {}),
        ("spec.rollout.maxStaleness", 0),
        ("spec.rollout.shmSize", "8Gi"),
    ]
    same = {"kind": "GagarRun", "spec": {"rollout": {"replicas": 1}}}
    assert bench.fit_to_checkout(same, tmp_path) == (same, []), "nothing to drop: unchanged"
