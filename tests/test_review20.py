"""Review 20 (a fresh user, no GPU; twentieth session): the threshold top-K layout after its
rank moved to the hypergeometric tail, and numpy 1's bool scalars in the int checks."""
from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from driverlevel import _checks
from driverlevel import _topk_threshold as tk
from driverlevel.reference import ddtree as ref
from driverlevel.reference.topk_threshold import threshold_topk


@pytest.mark.parametrize("vocab", [4100, 4111, 8191, 5000])
def test_m1_every_k_up_to_vocab_has_a_layout_and_an_exact_twin(vocab):
    """M1: K within 15 of a vocabulary above 4,096 that is not a multiple of 16 raised a
    ValueError about hypergeom_tail's arguments; now K - 1 is clamped to the sampled population."""
    rng = np.random.default_rng(vocab)
    row = rng.standard_normal(vocab).astype(np.float32)
    for k in (vocab - 15, vocab - 1, vocab):
        m = tk.sample_rank(k, vocab)
        assert 1 <= m <= tk.SAMPLE_VALUES
        assert tk.sample_slack(k, vocab) >= 0 and tk.candidate_capacity(k, vocab, 12288) >= 256
        r = threshold_topk(row, k)
        ids, lp, _ = ref.topk_logprobs(row[None], k)
        np.testing.assert_array_equal(r.ids, ids[0])


def test_l2_layout_arguments_are_ints():
    with pytest.raises(TypeError, match="k must be a positive int"):
        tk.sample_rank(5.7, 10000)
    with pytest.raises(TypeError, match="k must be a positive int"):
        tk.sample_rank(True, 10000)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        tk.sample_rank(0, 10000)
    with pytest.raises(TypeError, match="vocab must be a positive int"):
        tk.sample_rank(16, 163840.0)
    with pytest.raises(TypeError, match="population"):
        tk.hypergeom_tail(100.5, 3, 10)
    with pytest.raises(TypeError, match="successes"):
        tk.hypergeom_tail(100, False, 10)
    with pytest.raises(ValueError, match="draws"):
        tk.hypergeom_tail(100, 3, -1)
    assert tk.sample_rank(np.int64(256), np.int32(163840)) == 23


def test_l1_tail_accuracy_over_the_documented_range():
    """The docstring's claim: ~1e-8 relative up to a few million, ~1e-6 at 1e9."""
    for n, tol in ((163840, 1e-8), (4_000_000, 1e-8), (10**9, 1e-5)):
        t = tk.hypergeom_tail(n, 3, 4096)[1]
        exact = 1 - Fraction(comb(n - 3, 4096), comb(n, 4096))
        assert abs(t / float(exact) - 1) < tol, n


class _Numpy1Bool:
    """What numpy 1's ``np.bool_`` looks like to the checks: module numpy, name bool_, and an
    ``__index__`` (deprecated there, gone in numpy 2)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return int(self.v)


_Numpy1Bool.__module__ = "numpy"
_Numpy1Bool.__name__ = "bool_"


def test_int_checks_refuse_numpy1_bools():
    """The mends' note: _checks._as_int refused Python's bool only; numpy 1's bool scalar has
    __index__ and passed as 0 or 1."""
    for check in (_checks.positive_int, _checks.non_negative_int):
        with pytest.raises(TypeError, match="got bool"):
            check("max_q", _Numpy1Bool(True))
    with pytest.raises(TypeError, match="got bool"):
        _checks.int_in_range("depth", _Numpy1Bool(True), 0, 10)
    assert _checks.positive_int("max_q", np.int64(3)) == 3
