"""docs/security.md names the test that keeps each promise: every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_named_in_security_md_exists() -> None:
    doc = (ROOT / "docs" / "security.md").read_text()
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", doc))
    defined = {
        m
        for f in (ROOT / "tests").rglob("test_*.py")
        for m in re.findall(r"^(?:async )?def (test_[a-z0-9_]+)", f.read_text(), re.MULTILINE)
    }
    assert len(named) > 50 and sorted(named - defined) == []
