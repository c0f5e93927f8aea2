"""The self-test kernels (``cu/selftest.cu``): launch, graph and interop checks of the runtime.

Nothing here is on the verify path. The tests, ``driverlevel bench replay`` and
``driverlevel compile`` use it: :func:`compile_variants` is the hook ``driverlevel
compile`` calls for ``selftest.cu``.

Example
-------
>>> import numpy as np, driverlevel as dl                          # doctest: +SKIP
>>> from driverlevel import selftest  # doctest: +SKIP
>>> dev = dl.Device(0); s = dev.create_stream()  # doctest: +SKIP
>>> x = dl.DeviceBuffer.allocate(dev, 4 * 1024).as_array((1024,), np.float32)  # doctest: +SKIP
>>> mod = selftest.load(dev)  # doctest: +SKIP
>>> mod.kernel("fill_iota_f32").launch(s, 4, 256, [x, np.float32(1), np.int32(1024)])  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes

from ._compile import CompileVariant, Cubin, compile_file, normalize_arch
from ._module import Module, load_module, struct_layout_defines

__all__ = ["SOURCE", "SaxpyParams", "BIG_SMEM_FLOATS", "compile_defines", "dynamic_shared_bytes", "compile_variants",
           "compile", "load"]

SOURCE = "selftest.cu"

#: Floats ``reverse_f32_dynamic_smem`` stages when the tests launch it: 64 KB of dynamic
#: shared memory, over the 48 KB that needs no opt-in and under every sm_80+ limit.
BIG_SMEM_FLOATS = 16 * 1024


class SaxpyParams(ctypes.Structure):
    """ctypes mirror of ``SaxpyParams`` in ``cu/selftest.cu`` (passed by value)."""

    _fields_ = [
        ("x", ctypes.c_uint64),    # const float* [n]
        ("y", ctypes.c_uint64),    # float* [n]
        ("a", ctypes.c_float),
        ("n", ctypes.c_int32),
        ("tag", ctypes.c_int64),
    ]


def compile_defines(arch) -> dict:
    """Defines for ``selftest.cu``: the SaxpyParams layout, checked by static_assert."""
    normalize_arch(arch)
    return struct_layout_defines(SaxpyParams)


def dynamic_shared_bytes(arch) -> dict:
    """Dynamic shared memory per block, bytes, of the kernels launched with some."""
    normalize_arch(arch)
    return {"reverse_f32_dynamic_smem": BIG_SMEM_FLOATS * 4}


def compile_variants(arch) -> list[CompileVariant]:
    """The one way ``selftest.cu`` is compiled (:func:`compile`), with the tests' dynamic shared memory."""
    return [CompileVariant(compile_defines(arch), dynamic_shared_bytes(arch))]


def compile(arch) -> Cubin:  # noqa: A001 - mirrors compile_file
    """Compile ``selftest.cu`` for ``arch`` (cached)."""
    return compile_file(SOURCE, arch, compile_defines(arch))


def load(device) -> Module:
    """Compile for ``device``'s architecture and load the module on it."""
    from ._device import _check_device_arg

    device = _check_device_arg(device)
    return load_module(device, compile(device.arch))
