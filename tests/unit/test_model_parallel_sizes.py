"""Parallel sizes are checked against the world before any process group is touched."""

from __future__ import annotations

import pytest

from gagar.trainer.model.parallel import Parallel


@pytest.mark.parametrize(
    ("parallel", "world", "message"),
    [
        (Parallel(tp=0), 2, "tp=0 must be >= 1"),
        (Parallel(tp=2, pp=2), 6, r"world size 6 is not divisible by tp\*pp=4"),
        (Parallel(ep=4), 2, r"expert-parallel size 4 does not divide dp\*tp=2"),
    ],
)
def test_bad_sizes_are_refused(parallel: Parallel, world: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parallel.check(world)


def test_good_sizes_pass() -> None:
    Parallel(tp=2, ep=2, pp=2).check(8)  # dp = 2, ep divides dp*tp = 4
