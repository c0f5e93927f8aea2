"""The reduce-scatter exchange's P buffer in cu/verify_attention.cu, index arithmetic checked on the CPU.

Each warp of a row group stores P of its keys as u32 pairs at byte ``row * P_ROW + key * 2``
(``row = lane/4`` and ``lane/4 + 8``, ``key = n*8 + 2*(lane%4)``), then every warp reads the
whole 16 x N P with ``ldmatrix.x4`` (lane L addresses row ``L%16``, column ``(L/16)*8 + j*16``).
This transcribes those expressions and checks that the reads give exactly the m16n8k16 A
fragments the all-reduce path packs in registers, with no shared-memory bank conflicts.
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("keys, csplit", [(32, 4), (32, 2), (16, 2), (64, 4)])
def test_p_buffer_stores_and_ldmatrix_reads_give_the_a_fragments(keys, csplit):
    nt_s = keys // 8
    own = nt_s // csplit
    p_row = keys * 2 + 16
    mem = {}
    for warp in range(csplit):
        for n in range(own):
            ng = warp * own + n
            banks = set()
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                for row in (g, g + 8):
                    off = row * p_row + (ng * 8 + 2 * q) * 2
                    assert off % 4 == 0
                    mem[off], mem[off + 2] = (row, ng * 8 + 2 * q), (row, ng * 8 + 2 * q + 1)  # p0 in the low half
                banks.add((g * p_row + (ng * 8 + 2 * q) * 2) // 4 % 32)
            assert len(banks) == 32, "u32 stores of one warp hit a bank twice"
    assert len(mem) == 16 * keys
    for j in range(keys // 16):
        addr = [(lane & 15) * p_row + (lane >> 4) * 16 + j * 32 for lane in range(32)]
        assert all(a % 16 == 0 for a in addr)
        for i in range(4):  # matrix i: 8 rows of 16 B from lanes 8i .. 8i+7, one phase
            assert len({addr[8 * i + r] // 16 % 8 for r in range(8)}) == 8, "ldmatrix bank conflict"
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            got = [(mem[addr[8 * i + g] + 4 * q], mem[addr[8 * i + g] + 4 * q + 2]) for i in range(4)]
            k0 = j * 16 + 2 * q
            want = [((g, k0), (g, k0 + 1)), ((g + 8, k0), (g + 8, k0 + 1)),
                    ((g, k0 + 8), (g, k0 + 9)), ((g + 8, k0 + 8), (g + 8, k0 + 9))]
            assert got == want, (j, lane)
