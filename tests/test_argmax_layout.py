"""``driverlevel.argmax.argmax_layout``: the split of a row's tokens into work items and the grid,
and its argument checks (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel import argmax


@pytest.mark.parametrize("vocab", [1, 31, 32_768, 129_280, 151_936, 163_840])
@pytest.mark.parametrize("max_rows", [1, 8, 120, 4_096])
@pytest.mark.parametrize("sm_count", [1, 132, 188])
def test_items_cover_the_row_in_grains_and_the_grid_fits(vocab, max_rows, sm_count):
    split_len, splits, grid = argmax.argmax_layout(vocab, max_rows, sm_count)
    assert split_len % argmax.GRAIN == 0 and split_len > 0
    assert (splits - 1) * split_len < vocab <= splits * split_len  # every token in one item, no empty item
    assert 1 <= grid <= argmax.CTAS_PER_SM * sm_count
    one = argmax.argmax_layout(vocab, max_rows, sm_count, split=False)
    assert one[1] == 1 and one[0] >= vocab


@pytest.mark.parametrize("args, exc, match", [
    ((0, 8, 132), ValueError, "vocab must be"),
    ((-5, 8, 132), ValueError, "vocab must be"),
    ((32_768, 0, 132), ValueError, "max_rows must be"),
    ((32_768, 8, 0), ValueError, "sm_count must be"),
    ((True, 8, 132), TypeError, "vocab must be"),
    ((32_768.0, 8, 132), TypeError, "vocab must be"),
])
def test_bad_sizes_are_refused_by_name(args, exc, match):
    """Was a bare ZeroDivisionError (vocab or max_rows <= 0) or a silent layout (sm_count 0, a bool
    or a float vocab)."""
    with pytest.raises(exc, match=match):
        argmax.argmax_layout(*args)


def test_split_must_be_a_bool():
    with pytest.raises(TypeError, match="split must be a bool"):
        argmax.argmax_layout(32_768, 8, 132, split="no")
    assert argmax.argmax_layout(np.int64(32_768), np.int32(8), 132, split=np.bool_(False))[1] == 1
