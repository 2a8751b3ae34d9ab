"""How a bench writes its result JSON: with the record of the machine it ran on.

A timing says little without the CPU behind it: the same 2 cores are an Intel part with AMX on
one of this project's machines and an AVX2-only AMD EPYC on the next, where bfloat16 runs 37x
slower. ``save`` puts ``gagar.machine.machine()`` (CPU model, vector units, usable cores, masks,
platform, Python, torch and its kernel level) under ``"machine"`` in every result, so a reader
can tell which kind of CPU a number came from. ``tests/unit/test_bench_records.py`` fails when a
bench writes a result some other way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gagar.machine import machine


def save(path: str | Path, result: dict[str, Any], **json_kwargs: Any) -> dict[str, Any]:
    """Write ``result`` to ``path`` as JSON (``json_kwargs`` go to ``json.dumps``), folders
    made, with the machine record under ``"machine"``; returns what was written.

    What a bench measured about the machine itself (its load average) stays beside the record;
    where a key is in both, the record's wins, as it is the one way this project describes a CPU.
    """
    own = result.get("machine")
    doc = {**result, "machine": {**(own if isinstance(own, dict) else {}), **machine()}}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, **json_kwargs) + "\n")
    return doc
