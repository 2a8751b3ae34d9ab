"""docs/reference.md, the field reference generated from the models: in step with them, every
spec field there by its full path with the model's own description, and docs/ naming at least
95 % of the spec's leaf fields by full path."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from gagar.reference import REFERENCE_PATH, leaf_paths, reference_markdown, rows
from gagar.spec import GagarRunSpec
from tests.unit.test_spec_coverage import _models, leaf_fields

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_reference_is_what_the_models_generate() -> None:
    checked_in = (ROOT / REFERENCE_PATH).read_text()
    assert checked_in == reference_markdown(), f"{REFERENCE_PATH} drifted: run `make crd`"


def _descriptions(model: type[BaseModel] = GagarRunSpec, prefix: str = "spec") -> dict[str, str]:
    """Path -> the field's docstring, walking the pydantic models themselves."""
    out = {}
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        out[path] = " ".join((field.description or "").split()).replace("``", "`")  # as the CRD
        inner = _models(field.annotation)
        if inner:
            out |= _descriptions(inner[0], path)
    return out


def test_every_field_is_a_row_with_its_model_s_description() -> None:
    table = {row.path: row for row in rows()}
    models = _descriptions()
    assert set(leaf_fields()) <= set(table) and set(leaf_paths()) == set(leaf_fields())
    for path, text in models.items():
        assert path in table, f"{path} is missing from {REFERENCE_PATH}"
        assert table[path].description == text.replace("|", "\\|"), path
    tensor = table["spec.trainer.parallelism.tensor"]
    assert (tensor.type, tensor.default) == ("integer, ≥ 1", "`1`")
    assert table["spec.model.dtype"].type.startswith("one of: `auto`")


def test_docs_name_95_percent_of_the_spec_s_leaf_fields_by_full_path() -> None:
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("**/*.md")))
    named = set(re.findall(r"spec(?:\.[A-Za-z0-9]+)+", docs))
    leaves = leaf_fields()
    missing = [p for p in leaves if p not in named]
    assert len(missing) <= 0.05 * len(leaves), missing
