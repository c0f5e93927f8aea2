"""The device error word: how kernels inside a captured graph report bad metadata.

Inside a graph no host check runs, so every kernel that reads per-step metadata
(lengths, indptr arrays, slot ids, mask offsets) checks it against the plan's
maxima and buffer sizes, stays in bounds whatever it reads, writes a defined
output for the bad request, and records the first failure in a 16-byte word of
mapped pinned memory: ``{code, request, field, count}`` (int32 each). The host
reads it without a copy call after the stream's work is complete;
:meth:`DeviceErrorWord.check` raises :class:`~driverlevel._errors.MetadataError`
naming the request and the field, and clears the word.

The field and code numbers are defined here once and passed to the kernels as
``DL_FIELD_<NAME>`` / ``DL_ERR_<NAME>`` defines (:func:`error_defines`), so
Python and CUDA cannot disagree.
"""

from __future__ import annotations

import numpy as np

from ._checks import stream_arg
from ._errors import MetadataError
from ._memory import PinnedHostBuffer

__all__ = ["DeviceErrorWord", "FIELDS", "CODES", "error_defines"]

#: Metadata fields a kernel may name (index = the number written to the word).
FIELDS = (
    "none", "qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "custom_mask", "mask_indptr",
    "batch_size", "seq_lens", "req_to_token", "req_pool_indices", "parents", "tree_tokens", "logits",
)
#: What was wrong (index = the code written to the word; 0 = no error).
CODES = (
    "ok",
    "not_monotonic",      # an indptr array decreases, or does not start at 0 where it must
    "over_max",           # a length above the plan's maximum (max_q, max_context, ...)
    "out_of_range",       # an index (slot id, offset) outside the buffer it indexes
    "inconsistent",       # two fields disagree (mask_indptr vs the lengths, ...)
    "overflow",           # an offset past 2**31 where the kernel keeps 32 bits
    "not_finite",         # a row of values with no finite entry
)


def error_defines() -> dict:
    """``{"DL_FIELD_QO_INDPTR": 1, ..., "DL_ERR_OVER_MAX": 2, ...}`` for NVRTC."""
    d = {f"DL_FIELD_{name.upper()}": i for i, name in enumerate(FIELDS)}
    d.update({f"DL_ERR_{name.upper()}": i for i, name in enumerate(CODES)})
    return d


class DeviceErrorWord:
    """16 bytes of mapped pinned memory that kernels set on bad metadata (first failure wins).

    Parameters
    ----------
    device : Device
    label : str
        Names the owner in error messages (e.g. ``"VerifyAttention"``).

    Attributes
    ----------
    device_ptr : int
        The device address kernels write (``DeviceErrorWord*`` in ``cu/common.cuh``).
    """

    def __init__(self, device, label: str = "kernel"):
        self.label = label
        self.device = device
        self._buf = PinnedHostBuffer.allocate(device, 16, mapped=True, label=f"{label}.error_word")
        self._words = self._buf.numpy((4,), np.int32)
        self._words[:] = 0
        self.device_ptr = self._buf.device_ptr

    def read(self) -> tuple[int, int, int, int]:
        """``(code, request, field, count)`` as the kernels left them (no synchronisation)."""
        w = self._words.copy()
        return int(w[0]), int(w[1]), int(w[2]), int(w[3])

    def clear(self) -> None:
        """Reset the word (call only while no kernel that writes it is running)."""
        self._words[:] = 0

    def check(self, stream=None) -> None:
        """Raise :class:`MetadataError` if a kernel reported bad metadata, then clear the word.

        Parameters
        ----------
        stream : Stream, optional
            Synchronised first, so the work queued on it has finished (not capture-safe;
            call between steps). ``None``: not synchronised (the caller has made sure
            the work is complete).

        Raises
        ------
        TypeError
            ``stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream` (an
            :class:`~driverlevel.Event` would be synchronised in its place, and return
            before the kernels finish), checked before the word is read.
        ValueError
            ``stream`` belongs to another device than the word's (synchronising it would not
            wait for the kernels that write the word), checked before the word is read.
        MetadataError
            Naming the first bad request, the field and what was wrong.
        """
        if stream is not None:
            stream_arg("stream", stream, self.device, self.label).synchronize()
        code, request, field, count = self.read()
        if code == 0:
            return
        self.clear()
        fname = FIELDS[field] if 0 <= field < len(FIELDS) else f"field#{field}"
        cname = CODES[code] if 0 <= code < len(CODES) else f"code#{code}"
        raise MetadataError(self.label, request, fname, cname, max(count, 1))
