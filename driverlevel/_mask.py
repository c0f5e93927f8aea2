"""Mask formats of the verify attention: the one place their names live.

A draft token always sees the whole committed prefix of its request. Which
*draft* tokens of the same request it sees is described in one of four ways:

``"full"`` (:attr:`MaskFormat.FULL`, SGLang ``TreeMaskMode.FULL_MASK``)
    ``custom_mask`` uint8 (or bool, the same byte), flat. Request ``b``'s block
    starts at ``mask_indptr[b]`` (int64) and is ``q_len × (prefix_len + q_len)``
    row-major: row ``i`` is draft token ``i``, columns ``0 .. prefix_len-1`` are
    the prefix (not read: the prefix is always visible, as in SGLang's Triton
    backend's default ``skip_prefix_custom_mask``; SGLang's tree builder may leave
    them unwritten), column ``prefix_len + j`` is draft token ``j``.
``"qlen_only"`` (:attr:`MaskFormat.QLEN_ONLY`, SGLang ``TreeMaskMode.QLEN_ONLY``)
    Same, without the prefix columns: a ``q_len × q_len`` block per request at
    ``mask_indptr[b]``. SGLang locates these blocks by a uniform ``n * n * b`` and
    builds no ``mask_indptr``: pass ``arange(0, (bs + 1) * n * n, n * n)`` (int64,
    built once: it does not change between steps). SGLang's ``QLEN_ONLY_BITPACKING``
    (one uint8/16/32 per row by ``n``) matches ``"bitmask"``'s bit order; widen it to
    uint32 ``[total_q, 1]`` for ``max_q <= 32``.
``"bitmask"`` (:attr:`MaskFormat.BITMASK`, driverlevel's packed form)
    uint32 ``[total_q, n_words]``. Bit ``j`` of word ``w`` in row ``t`` is set
    when draft token ``32*w + j`` of the same request is visible to global draft
    row ``t``. ``n_words = ceil(max_q / 32)`` (:func:`bitmask_words`) is fixed
    by the plan; bits at or past the request's ``q_len`` are zero.
``"causal"`` (:attr:`MaskFormat.CAUSAL`, a chain)
    Draft token ``i`` sees draft tokens ``0 .. i``. No mask buffer.
"""

from __future__ import annotations

import enum

from ._checks import positive_int

__all__ = [
    "MaskFormat",
    "BITMASK_WORD_BITS",
    "parse_mask_format",
    "bitmask_words",
]

#: Bits per word of the packed bitmask (the words are uint32).
BITMASK_WORD_BITS = 32


class MaskFormat(str, enum.Enum):
    """How the draft-to-draft visibility of a verify call is described.

    The members compare equal to their string values, so ``"full"`` and
    ``MaskFormat.FULL`` may be used interchangeably.
    """

    FULL = "full"
    QLEN_ONLY = "qlen_only"
    BITMASK = "bitmask"
    CAUSAL = "causal"

    def __str__(self) -> str:  # "full", not "MaskFormat.FULL"
        return self.value

    @property
    def uses_mask_indptr(self) -> bool:
        """True for the SGLang layouts, whose blocks are located by ``mask_indptr``."""
        return self in (MaskFormat.FULL, MaskFormat.QLEN_ONLY)

    @property
    def has_mask_buffer(self) -> bool:
        """False only for :attr:`CAUSAL`, which needs no mask buffer."""
        return self is not MaskFormat.CAUSAL


def parse_mask_format(mask_format: "MaskFormat | str") -> MaskFormat:
    """Return the :class:`MaskFormat` named by ``mask_format``.

    Parameters
    ----------
    mask_format : MaskFormat or str
        A member, or one of ``"full"``, ``"qlen_only"``, ``"bitmask"``,
        ``"causal"`` (case-insensitive).

    Returns
    -------
    MaskFormat

    Raises
    ------
    TypeError
        ``mask_format`` is neither a :class:`MaskFormat` nor a str.
    ValueError
        The string names no format.
    """
    if isinstance(mask_format, MaskFormat):
        return mask_format
    if not isinstance(mask_format, str):
        raise TypeError(
            f"mask_format must be a MaskFormat or str, got {type(mask_format).__name__}"
        )
    try:
        return MaskFormat(mask_format.lower())
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in MaskFormat)
        raise ValueError(f"mask_format must be one of {allowed}, got {mask_format!r}") from None


def bitmask_words(max_q: int) -> int:
    """Number of uint32 words per draft token for the packed bitmask.

    Parameters
    ----------
    max_q : int
        Largest number of draft tokens of any request the plan accepts (>= 1).

    Returns
    -------
    int
        ``ceil(max_q / 32)``.

    Raises
    ------
    TypeError
        ``max_q`` is not an int (bool is refused).
    ValueError
        ``max_q < 1``.
    """
    max_q = positive_int("max_q", max_q)
    return -(-max_q // BITMASK_WORD_BITS)
