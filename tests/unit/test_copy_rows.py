"""The copying curriculum's rows: a span, filler, the same span again, in the measured shape."""

from __future__ import annotations

import random

import pytest

from gagar.trainer.model.presets import COPY_BATCH, COPY_FILLER, COPY_SPAN, copy_rows

POOL = list(range(100, 600))


def test_rows_repeat_their_span_after_filler_within_the_default_shape() -> None:
    rng = random.Random(0)
    spans, fillers = set(), set()
    for _ in range(50):
        rows = copy_rows(rng, POOL)
        assert len(rows) == COPY_BATCH
        for row, n in rows:
            assert row[-n:] == row[:n]  # the repeat is the span
            assert all(t in POOL for t in row)
            spans.add(n)
            fillers.add(len(row) - 2 * n)
    # the whole inclusive range is drawn, nothing outside it
    assert spans == set(range(COPY_SPAN[0], COPY_SPAN[1] + 1))
    assert fillers == set(range(COPY_FILLER[0], COPY_FILLER[1] + 1))


def test_the_shape_is_the_measured_short_one() -> None:
    # Spans of 4-24 after 0-16 of filler left the plateau at 700-850 steps, 4-10 after 0-4 at
    # 350-550 (bench/copy_curriculum.py): the embedded default's 600 steps assume the latter.
    assert COPY_SPAN == (4, 10) and COPY_FILLER == (0, 4)


@pytest.mark.parametrize(("span", "filler"), [((6, 6), (3, 3)), ((2, 30), (0, 0))])
def test_other_shapes_are_drawn_as_given(span: tuple[int, int], filler: tuple[int, int]) -> None:
    for row, n in copy_rows(random.Random(1), POOL, span, filler):
        assert span[0] <= n <= span[1]
        assert filler[0] <= len(row) - 2 * n <= filler[1]
        assert row[-n:] == row[:n]
