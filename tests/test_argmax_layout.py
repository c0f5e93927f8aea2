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


def test_decode_part_reads_the_kernels_composites():
    key = np.uint64(0x8000_0001) << np.uint64(32)
    tokens, finite = argmax.decode_part(np.array([0, key | np.uint64(0xFFFF_FFFF - 7)], np.uint64))
    assert tokens.tolist() == [0, 7] and finite.tolist() == [False, True]
    assert argmax.decode_part([])[0].shape == (0,)


@pytest.mark.parametrize("part, exc, words", [
    (np.array([1.0, 2.0], np.float32), TypeError, "got dtype float32"),  # was truncated into composites
    (np.array([True]), TypeError, "got dtype bool"),
    (None, TypeError, "got dtype object"),  # was int()'s 'argument must be ... not NoneType'
    ("x", TypeError, "got dtype <U1"),  # was int()'s 'invalid literal for int() with base 10'
    (np.array([5, -1], np.int64), ValueError, "got a negative value -1"),  # was decoded as 2**64 - 1
    ([1, 2, 3], ValueError, "got 0x1"),  # (review 39) was token -2, flagged finite
])
def test_decode_part_refuses_what_is_no_composite(part, exc, words):
    with pytest.raises(exc, match="decode_part: part must hold the uint64 composites the kernels write") as info:
        argmax.decode_part(part)
    assert words in str(info.value)


def test_decode_part_of_a_device_array_says_to_copy_it_first():
    """np.asarray of a DeviceArray gave its elements' device addresses: decoded as tokens, silently."""
    from driverlevel import DeviceArray

    class Dev:
        ordinal = 0

    with pytest.raises(TypeError, match=r"to_numpy\(stream\)"):
        argmax.decode_part(DeviceArray(0x7F00_0000_0000, (4,), np.uint64, Dev()))


def test_rows_longer_than_2_30_are_refused():
    """The kernels index a row with 32-bit ints: 2**32 + 1024 was packed as 1,024 (and its splits' starts wrapped
    negative), lengths between 2**31 and 2**32 as negative ones."""
    assert argmax.argmax_layout(argmax.MAX_ROW_LEN, 8, 132)[0] > 0
    for n in (argmax.MAX_ROW_LEN + 1, 2**31 - 1, 2**32 + 1024):
        with pytest.raises(ValueError, match=r"vocab \(the row length\) must be <= 1,073,741,824"):
            argmax.argmax_layout(n, 8, 132)
