"""The error measures every check reports (compare.report.tensor_error, Sums; compare.measures.change_error),
gathered block by block, against the same quantities computed over whole arrays in float64."""
import math

import numpy as np
import pytest

from compare import measures, report

# Not a multiple of the block, so that the last block is a short one.
SIZE = 2 * report.BLOCK + 1234


def _whole(a, b, floor=0.0):
    """(max_abs, max_rel, rel_l2) over whole float64 arrays, as the definitions read."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    diff = np.abs(a - b)
    return diff.max(), (diff / (np.abs(b) + report.TINY)).max(), np.linalg.norm(diff) / max(np.linalg.norm(b), floor)


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(3)
    before = rng.standard_normal(SIZE).astype(np.float32).reshape(-1, 2)
    legacy = (before + 1e-3 * rng.standard_normal(before.shape)).astype(np.float32)
    modern = (legacy + 1e-7 * rng.standard_normal(before.shape)).astype(np.float32)
    return before, legacy, modern


def test_tensor_error_over_blocks_is_the_whole_array_measure(arrays):
    _, legacy, modern = arrays
    got = report.tensor_error("t", modern, legacy, floor=3.0)
    max_abs, max_rel, rel_l2 = _whole(modern, legacy, floor=3.0)
    assert got.max_abs == max_abs and got.max_rel == pytest.approx(max_rel, rel=1e-12)
    assert got.rel_l2 == pytest.approx(rel_l2, rel=1e-12)


def test_change_error_is_the_change_against_the_change_with_its_roundoff_floor(arrays):
    before, legacy, modern = arrays
    tol = 1e-6
    got = measures.change_error("c", before, modern, legacy, tol)
    b0 = before.astype(np.float64)
    ulp = lambda x: np.linalg.norm(np.spacing(np.abs(x)).astype(np.float64))  # noqa: E731
    floor = ulp(before) + 2 * ulp(legacy) + 8 * report.EPS32 * np.linalg.norm(legacy - b0)
    max_abs, max_rel, rel_l2 = _whole(modern - b0, legacy - b0, floor=floor / tol)
    assert got.max_abs == pytest.approx(max_abs, rel=1e-12) and got.max_rel == pytest.approx(max_rel, rel=1e-12)
    assert got.rel_l2 == pytest.approx(rel_l2, rel=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_in_any_block_is_never_agreement(arrays, bad):
    before, legacy, modern = arrays
    for where in (0, SIZE // 2 - 1, SIZE // 2 - 7):  # the first block, the last (short) one, between
        broken = modern.copy()
        broken.reshape(-1)[where] = bad
        assert math.isinf(report.tensor_error("t", broken, legacy).rel_l2)
        assert math.isinf(measures.change_error("c", before, broken, legacy, 1e-6).rel_l2)
        both = legacy.copy()
        both.reshape(-1)[where] = bad
        assert math.isinf(report.tensor_error("t", broken, both).rel_l2), "NaN (or Inf) on both sides"


def test_empty_scalar_and_mismatched_shapes():
    empty = np.zeros((0, 3), np.float32)
    assert report.tensor_error("e", empty, empty).rel_l2 == 0.0
    scalar = report.tensor_error("s", np.float32(3.0), np.float32(2.0))
    assert (scalar.max_abs, scalar.max_rel, scalar.rel_l2) == (1.0, 0.5, 0.5)
    with pytest.raises(ValueError, match="shapes differ"):
        report.tensor_error("m", np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="shapes differ"):
        measures.change_error("m", np.zeros(3), np.zeros(3), np.zeros((3, 1)), 1e-6)
