"""Review 19 (d): the references' logits and bf16 converters, ``code_sections.py``, the reference
argument checks, ``compile_source``'s defines and options, and names and flags (CPU only).

Each test fails on the code before its fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel.reference import ddtree as R
from driverlevel.reference.attention import bf16_to_f32, f32_to_bf16


# --------------------------------------------------------------------------- M3: bf16 logits in reference.ddtree


def _bf16_logits(shape, seed=0):
    """Random logits rounded to bf16: (uint16 bits, the same values widened to float32)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    bits = f32_to_bf16(x)
    return bits, bf16_to_f32(bits)


def test_row_argmax_reads_uint16_as_bf16_bits():
    bits = f32_to_bf16(np.array([[1.0, -1.0], [-3.0, -2.0]]))
    ids, finite = R.row_argmax(bits)
    assert ids.tolist() == [0, 1] and finite.all()


def test_topk_logprobs_reads_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((3, 16))
    for got, want in zip(R.topk_logprobs(bits, 4), R.topk_logprobs(wide, 4)):
        np.testing.assert_array_equal(got, want)
    _, _, lse = R.topk_logprobs(np.array([[0x3F80, 0x4000]], np.uint16), 1)  # 1.0, 2.0
    assert lse[0] == pytest.approx(np.log(np.e + np.e ** 2), rel=1e-6)


def test_build_tree_and_greedy_accept_read_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((1, 3, 16), seed=1)
    got, want = R.build_tree([1], bits, budget=4), R.build_tree([1], wide, budget=4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    n = int(want.node_counts[0])
    tbits, twide = _bf16_logits((n, 16), seed=2)
    a = R.greedy_accept(want, [0, n], tbits, [True], [0], 100, 3)
    b = R.greedy_accept(want, [0, n], twide, [True], [0], 100, 3)
    np.testing.assert_array_equal(a.posterior, b.posterior)
    np.testing.assert_array_equal(a.accepted_nodes, b.accepted_nodes)


@pytest.mark.parametrize("call", [
    lambda x: R.row_argmax(x),
    lambda x: R.topk_logprobs(x, 1),
    lambda x: R.build_tree([0], x[None], budget=2),
    lambda x: R.greedy_accept(R.build_tree([0], np.zeros((1, 1, 2), np.float32), budget=1), [0, 2],
                              np.concatenate([x, x])[:2], [True], [0], 100, 1),
])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint32, np.bool_])
def test_integer_logits_are_refused(call, dtype):
    with pytest.raises(TypeError, match="float array, an ml_dtypes.bfloat16 array or uint16"):
        call(np.array([[1, 0]], dtype))


def test_ml_dtypes_bfloat16_logits_match_their_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits, wide = _bf16_logits((1, 3, 16), seed=3)
    ml = bits.view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(R.build_tree([1], ml, budget=4).tokens, R.build_tree([1], wide, budget=4).tokens)
    assert R.row_argmax(np.array([[1.0, -1.0]], ml_dtypes.bfloat16))[0].tolist() == [0]
