"""The driver runtime on a GPU: devices, launches, events, memory, threads, interop.

Uses the self-test kernels of ``cu/selftest.cu``. Data is never zero; outputs are
poisoned with NaN before kernels write them.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import _array, selftest
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = pytest.mark.gpu

F32_NAN = 0x7FC00000
N = 1000  # not a multiple of the block size: the tail threads must exit


def grid(n, block=256):
    return (math.ceil(n / block),)


def device_array(device, shape, dtype, label="test"):
    nbytes = max(int(np.prod(shape)) * dl._dtypes.as_dtype(dtype).itemsize, 1)
    return dl.DeviceBuffer.allocate(device, nbytes, label=label).as_array(shape, dtype)


def upload(device, host, label="test"):
    host = np.ascontiguousarray(host)
    return device_array(device, host.shape, host.dtype, label).copy_from_host(host)


def poisoned(device, shape, stream, dtype=np.float32):
    a = device_array(device, shape, dtype)
    a.fill_u32(F32_NAN, stream)
    return a


# -- devices -------------------------------------------------------------------------------------------
def test_device_properties(device):
    p = device.properties
    assert p.name and isinstance(p.name, str)
    assert p.compute_capability >= (8, 0)
    assert device.arch == p.arch == f"sm_{p.compute_capability[0]}{p.compute_capability[1]}"
    assert p.sm_count > 0
    assert p.max_shared_memory_per_block == 48 * 1024
    assert p.max_shared_memory_per_block_optin >= p.max_shared_memory_per_block
    assert p.l2_cache_bytes > 0 and p.total_memory_bytes > 0
    free, total = device.mem_info()
    assert 0 < free <= total
    assert dl.Device(0) is device and dl.Device(device) is device
    major, minor = dl.runtime.driver_version()
    assert major >= 12 and minor >= 0


def test_device_arguments_are_checked(device):
    with pytest.raises(ValueError, match="out of range"):
        dl.Device(dl.device_count())
    with pytest.raises(TypeError, match="must be an int"):
        dl.Device("0")
    with pytest.raises(TypeError, match="must be an int"):
        dl.Device(True)


# -- launches ------------------------------------------------------------------------------------------
def test_launch_and_check_result(device, stream, selftest_module):
    x = poisoned(device, (N,), stream)
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(3.0), np.int32(N)])
    selftest_module.kernel("add_scalar_f32").launch(stream, grid(N), 256, [x, np.float32(0.5), np.int32(N)])
    np.testing.assert_array_equal(x.to_numpy(stream), 3.5 + np.arange(N, dtype=np.float32))


def test_saxpy_positional_and_struct_by_value(device, stream, selftest_module):
    rng = np.random.default_rng(1)
    xh = rng.integers(1, 100, N).astype(np.float32)  # exact in fp32 with or without FMA
    yh = rng.integers(1, 100, N).astype(np.float32)
    x, y1, y2 = upload(device, xh), upload(device, yh), upload(device, yh)
    selftest_module.kernel("saxpy_f32").launch(stream, grid(N), 256, [np.float32(1.5), x, y1, np.int32(N)])
    p = selftest.SaxpyParams(x=x.ptr, y=y2.ptr, a=1.5, n=N, tag=-1)
    selftest_module.kernel("saxpy_params").launch(stream, grid(N), 256, [p])
    want = np.float32(1.5) * xh + yh
    np.testing.assert_array_equal(y1.to_numpy(stream), want)
    np.testing.assert_array_equal(y2.to_numpy(stream), want)


def test_int64_scalar_argument(device, stream, selftest_module):
    base = np.arange(N, dtype=np.int64) * 7 + 1
    x = upload(device, base)
    v = np.int64(3 * 2**40 + 5)
    selftest_module.kernel("add_i64").launch(stream, grid(N), 256, [x, v, np.int32(N)])
    np.testing.assert_array_equal(x.to_numpy(stream), base + v)


def test_prepared_launch_reused_and_updated(device, stream, selftest_module):
    x, y = poisoned(device, (N,), stream), poisoned(device, (N,), stream)
    p = selftest_module.kernel("fill_iota_f32").prepare(grid(N), 256, [x, np.float32(1.0), np.int32(N)])
    p.launch(stream)
    p.set_arg(0, y)
    p.set_arg(1, np.float32(10.0))
    p.launch(stream)
    np.testing.assert_array_equal(x.to_numpy(stream), 1 + np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(y.to_numpy(stream), 10 + np.arange(N, dtype=np.float32))


def test_dynamic_shared_memory_over_48k_opt_in(device, stream, selftest_module):
    n = selftest.BIG_SMEM_FLOATS
    src = upload(device, np.arange(n, dtype=np.float32) + 1)
    out = poisoned(device, (n,), stream)
    k = selftest_module.kernel("reverse_f32_dynamic_smem")
    k.launch(stream, 1, 256, [src, out, np.int32(n)], shared_mem=n * 4)  # 64 KB > 48 KB
    np.testing.assert_array_equal(out.to_numpy(stream), np.arange(n, dtype=np.float32)[::-1] + 1)
    too_much = device.properties.max_shared_memory_per_block_optin + 1024
    with pytest.raises(ValueError, match="exceeds the device's"):
        k.prepare(1, 256, [src, out, np.int32(n)], shared_mem=too_much)


def test_static_shared_memory_kernel(device, stream, selftest_module):
    xh = np.random.default_rng(2).integers(1, 9, N).astype(np.float32)
    x, out = upload(device, xh), upload(device, np.zeros(1, np.float32))
    selftest_module.kernel("block_sum_f32").launch(stream, grid(N), 256, [x, out, np.int32(N)])
    assert out.to_numpy(stream)[0] == xh.sum()
    assert selftest_module.kernel("block_sum_f32").resources.shared_bytes == 1024


def test_unknown_kernel_and_wrong_arch(device, selftest_module):
    with pytest.raises(dl.CudaError, match="cuModuleGetFunction"):
        selftest_module.kernel("no_such_kernel")
    other = "sm_80" if device.arch != "sm_80" else "sm_90"
    with pytest.raises(ValueError, match=f"compiled for {other}"):
        dl.load_module(device, selftest.compile(other))


def test_load_module_is_cached(device, selftest_module):
    assert selftest.load(device) is selftest_module


# -- events --------------------------------------------------------------------------------------------
def test_events_elapsed_ms(device, stream, selftest_module):
    start, end = device.create_event(), device.create_event()
    spin = selftest_module.kernel("spin_wait_ns")
    start.record(stream)
    spin.launch(stream, 1, 32, [np.int64(2_000_000)])  # 2 ms
    end.record(stream)
    end.synchronize()
    assert end.query() and start.query()
    ms = start.elapsed_ms(end)
    assert 1.0 < ms < 1000.0


def test_event_query_before_completion(device, stream, selftest_module):
    ev = device.create_event(timing=False)
    selftest_module.kernel("spin_wait_ns").launch(stream, 1, 32, [np.int64(50_000_000)])  # 50 ms
    ev.record(stream)
    assert ev.query() is False
    ev.synchronize()
    assert ev.query() is True


def test_stream_wait_orders_two_streams(device, selftest_module):
    a, b = device.create_stream(), device.create_stream()
    x = device_array(device, (N,), np.float32)
    ev = device.create_event(timing=False)
    selftest_module.kernel("spin_wait_ns").launch(a, 1, 32, [np.int64(5_000_000)])
    selftest_module.kernel("fill_iota_f32").launch(a, grid(N), 256, [x, np.float32(1), np.int32(N)])
    ev.record(a)
    b.wait(ev)
    selftest_module.kernel("add_scalar_f32").launch(b, grid(N), 256, [x, np.float32(1), np.int32(N)])
    np.testing.assert_array_equal(x.to_numpy(b), 2 + np.arange(N, dtype=np.float32))


# -- memory --------------------------------------------------------------------------------------------
def test_pinned_mapped_buffer_written_by_a_kernel(device, stream, selftest_module):
    buf = dl.PinnedHostBuffer.allocate(device, N * 4, mapped=True)
    host = buf.numpy((N,), np.float32)
    host[:] = np.nan
    ev = device.create_event(timing=False)
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [buf.as_array((N,), np.float32),
                                                                          np.float32(5), np.int32(N)])
    ev.record(stream)
    ev.synchronize()
    np.testing.assert_array_equal(host, 5 + np.arange(N, dtype=np.float32))  # no copy call


def test_unmapped_pinned_buffer_has_no_device_view(device):
    buf = dl.PinnedHostBuffer.allocate(device, 64)
    assert buf.device_ptr is None
    with pytest.raises(ValueError, match="mapped=True"):
        buf.as_array()
    buf.close()
    buf.close()  # idempotent


def test_host_device_copies_and_fills(device, stream):
    rng = np.random.default_rng(3)
    h = rng.standard_normal((17, 33)).astype(np.float32) + 5
    a = upload(device, h)
    np.testing.assert_array_equal(a.to_numpy(), h)
    b = device_array(device, (17, 33), np.float32)
    b.copy_from(a, stream)
    np.testing.assert_array_equal(b.to_numpy(stream), h)
    b.fill_u32(0x3F800000, stream)  # 1.0f
    np.testing.assert_array_equal(b.to_numpy(stream), np.ones((17, 33), np.float32))
    b.fill_bytes(0, stream)
    assert not b.to_numpy(stream).any()
    a.copy_from_host(h * 2, stream)
    np.testing.assert_array_equal(a.to_numpy(stream), h * 2)


def test_bfloat16_roundtrip(device, stream):
    f = np.random.default_rng(4).standard_normal((8, 576)).astype(np.float32)
    bits = f32_to_bf16_bits(f)
    a = device_array(device, (8, 576), dl.bfloat16).copy_from_host(bits)
    back = a.to_numpy(stream)
    assert back.dtype == np.uint16
    np.testing.assert_array_equal(bf16_bits_to_f32(back), bf16_bits_to_f32(bits))


def test_buffer_close_is_idempotent(device):
    b = dl.DeviceBuffer.allocate(device, 1024)
    b.close()
    b.close()


def test_arrays_of_a_closed_pool_are_refused_and_a_newer_allocation_is_untouched(device, stream):
    """The freed range is often handed to the next allocation: a fill through the stale view would write it."""
    pool = dl.WorkspacePool.allocate(device, 1 << 20, label="stale")
    x = pool.carve("x", (1024,), np.float32).fill_u32(0x3F800000, stream)
    stream.synchronize()  # (the fill done before the free)
    pool.close()
    newer = dl.DeviceBuffer.allocate(device, 1 << 20, label="newer")
    y = newer.as_array((1024,), np.float32).fill_u32(0x40000000, stream)  # 2.0f
    for call in (lambda: x.fill_u32(0, stream), lambda: x.copy_from(y, stream), lambda: x.to_numpy(stream)):
        with pytest.raises(ValueError, match="the memory of this array was freed"):
            call()
    np.testing.assert_array_equal(y.to_numpy(stream), np.full(1024, 2.0, np.float32))
    newer.close()


def test_out_of_memory_names_the_call(device):
    free, total = device.mem_info()
    with pytest.raises(dl.CudaError) as ei:
        dl.DeviceBuffer.allocate(device, total * 4, label="too-big")
    assert ei.value.call == "cuMemAlloc" and ei.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "too-big" in str(ei.value)


def test_pool_carves_on_the_gpu(device, stream, selftest_module):
    pool = dl.WorkspacePool.allocate(device, dl.WorkspacePool.required_bytes([((N,), np.float32)] * 2), label="gpu")
    a, b = pool.carve("a", (N,), np.float32), pool.carve("b", (N,), np.float32)
    k = selftest_module.kernel("fill_iota_f32")
    k.launch(stream, grid(N), 256, [a, np.float32(1), np.int32(N)])
    k.launch(stream, grid(N), 256, [b, np.float32(2), np.int32(N)])
    np.testing.assert_array_equal(a.to_numpy(stream), 1 + np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(b.to_numpy(stream), 2 + np.arange(N, dtype=np.float32))
    with pytest.raises(dl.PoolExhaustedError):
        pool.carve("c", (1,), np.float32)


# -- threads -------------------------------------------------------------------------------------------
def run_in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(120)
    assert not t.is_alive(), "thread hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_device_used_from_a_new_thread(device, selftest_module):
    x = device_array(device, (N,), np.float32)  # allocated in the main thread

    def work():
        s = device.create_stream()  # the context is made current in this new thread
        y = device_array(device, (N,), np.float32)
        selftest_module.kernel("fill_iota_f32").launch(s, grid(N), 256, [x, np.float32(7), np.int32(N)])
        y.copy_from(x, s)
        ev = device.create_event()
        ev.record(s)
        ev.synchronize()
        device.synchronize()
        return y.to_numpy(s)

    np.testing.assert_array_equal(run_in_thread(work), 7 + np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(x.to_numpy(), 7 + np.arange(N, dtype=np.float32))


def test_fresh_thread_can_read_back_without_any_setup(device, stream, selftest_module):
    x = device_array(device, (N,), np.float32)
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(1), np.int32(N)])
    stream.synchronize()
    np.testing.assert_array_equal(run_in_thread(x.to_numpy), 1 + np.arange(N, dtype=np.float32))


# -- interop (zero copy, both protocols) -----------------------------------------------------------------
class DLPackOnly:
    def __init__(self, x):
        self._x = x

    def __dlpack__(self, stream=None):
        return self._x.__dlpack__(stream=stream) if stream is not None else self._x.__dlpack__()

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


@pytest.fixture
def cupy_cuda(device):
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.Device(device.ordinal).use()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"cupy cannot use the GPU: {exc}")
    return cupy


@pytest.mark.parametrize("protocol", ["cai", "dlpack"])
def test_torch_tensor_imported_without_copy(device, stream, selftest_module, torch_cuda, protocol):
    torch = torch_cuda
    t = torch.arange(N, dtype=torch.float32, device=f"cuda:{device.ordinal}") + 1
    torch.cuda.synchronize()
    a = dl.runtime.as_device_array(t if protocol == "cai" else DLPackOnly(t))
    assert a.ptr == t.data_ptr() and a.shape == (N,) and a.dtype == np.float32
    selftest_module.kernel("add_scalar_f32").launch(stream, grid(N), 256, [a, np.float32(0.5), np.int32(N)])
    stream.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), 1.5 + np.arange(N, dtype=np.float32))


class DLPackRecorder:
    """Forwards every ``__dlpack__`` keyword (``max_version`` included) and records the capsule kind returned."""

    def __init__(self, x):
        self._x, self.kinds = x, []

    def __dlpack__(self, **kw):
        capsule = self._x.__dlpack__(**kw)
        self.kinds.append("versioned" if _array._PyCapsule_IsValid(capsule, b"dltensor_versioned") else "legacy")
        return capsule

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


@pytest.mark.parametrize("peer", ["torch", "cupy"])
def test_a_peer_array_imported_through_a_versioned_capsule(device, stream, selftest_module, peer, request):
    """DLPack 1.0: the import asks for the versioned capsule; a writable peer array comes back writable, the
    same memory, and a kernel's write through it is what the peer reads."""
    if peer == "torch":
        torch = request.getfixturevalue("torch_cuda")
        t = torch.arange(N, dtype=torch.float32, device=f"cuda:{device.ordinal}") + 1
        torch.cuda.synchronize()
        ptr, read = t.data_ptr(), lambda: t.cpu().numpy()
    else:
        cp = request.getfixturevalue("cupy_cuda")
        t = cp.arange(N, dtype=cp.float32) + 1
        cp.cuda.Device(device.ordinal).synchronize()
        ptr, read = int(t.data.ptr), lambda: cp.asnumpy(t)
    src = DLPackRecorder(t)
    a = dl.runtime.as_device_array(src)
    if src.kinds[-1:] != ["versioned"]:
        pytest.skip(f"this {peer} exports no versioned DLPack capsule (got {src.kinds})")
    assert a.ptr == ptr and a.shape == (N,) and a.dtype == np.float32 and not a.readonly
    selftest_module.kernel("add_scalar_f32").launch(stream, grid(N), 256, [a, np.float32(0.5), np.int32(N)])
    stream.synchronize()
    np.testing.assert_array_equal(read(), 1.5 + np.arange(N, dtype=np.float32))


def test_request_state_of_cupy_arrays_is_viewed_without_a_copy(device, stream, cupy_cuda):
    """RequestState takes foreign CUDA arrays: its fields become DeviceArray views of the same
    memory, so key(), upload() and download() (and the plans' launch parameters) work on them."""
    cp = cupy_cuda
    B, C = 4, 16
    fields = dict(active=cp.zeros(B, cp.uint8), root_tokens=cp.zeros(B, cp.int32), seq_lens=cp.zeros(B, cp.int64),
                  req_pool_indices=cp.zeros(B, cp.int64), req_to_token=cp.zeros((B, C), cp.int32),
                  free_slots=cp.zeros(64, cp.int64), free_count=cp.zeros(1, cp.int64))
    state = dl.RequestState(**fields)
    assert all(isinstance(a, dl.DeviceArray) for a in state.arrays().values())
    assert [k[0] for k in state.key()[:7]] == [int(v.data.ptr) for v in fields.values()]
    rng = np.random.default_rng(5)
    seq = rng.integers(1, 10**9, B)
    r2t = rng.integers(0, 2**31 - 1, (B, C)).astype(np.int32)
    state.upload(seq_lens=seq, req_to_token=r2t, active=[True, False, True, True])
    cp.cuda.Device(device.ordinal).synchronize()
    np.testing.assert_array_equal(cp.asnumpy(fields["seq_lens"]), seq)
    np.testing.assert_array_equal(cp.asnumpy(fields["req_to_token"]), r2t)
    got = state.download()
    np.testing.assert_array_equal(got["active"], [1, 0, 1, 1])
    np.testing.assert_array_equal(got["req_to_token"], r2t)


def test_request_state_copies_on_a_stream_are_ordered_after_its_work(device, stream):
    """upload(stream=) and download(stream) queue on that (non-blocking) stream: a download right after a fill
    queued there, with no synchronization between, reads what the fill wrote."""
    B, C = 4, 4096
    st = dl.RequestState.allocate(device, max_batch=B, max_context=C, num_slots=64)
    r2t = np.random.default_rng(7).integers(0, 2**31 - 1, (B, C)).astype(np.int32)
    st.upload(stream=stream, req_to_token=r2t, seq_lens=[5, 6, 7, 8])
    got = st.download(stream)
    np.testing.assert_array_equal(got["req_to_token"], r2t)
    np.testing.assert_array_equal(got["seq_lens"], [5, 6, 7, 8])
    for word in (0x5A5A5A5A, 0x12345678):
        st.req_to_token.fill_u32(word, stream)
        np.testing.assert_array_equal(st.download(stream)["req_to_token"], np.full((B, C), word, np.int32))


def test_torch_bfloat16_imported_through_dlpack(device, torch_cuda):
    torch = torch_cuda
    t = torch.ones((4, 576), dtype=torch.bfloat16, device=f"cuda:{device.ordinal}")
    torch.cuda.synchronize()
    a = dl.runtime.as_device_array(t)
    assert a.dtype is dl.bfloat16 and a.ptr == t.data_ptr() and a.shape == (4, 576)
    np.testing.assert_array_equal(bf16_bits_to_f32(a.to_numpy()), np.ones((4, 576), np.float32))


def test_torch_strided_view_keeps_strides(device, torch_cuda):
    torch = torch_cuda
    t = torch.zeros((8, 6), dtype=torch.float32, device=f"cuda:{device.ordinal}")[:, 1:4]
    for src in (t, DLPackOnly(t)):
        a = dl.runtime.as_device_array(src)
        assert a.ptr == t.data_ptr() and a.shape == (8, 3) and a.strides == (24, 4) and not a.is_c_contiguous


@pytest.mark.parametrize("protocol", ["dlpack", "cai"])
def test_ours_exported_to_torch(device, stream, selftest_module, torch_cuda, protocol):
    torch = torch_cuda
    x = device_array(device, (N,), np.float32)
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(2), np.int32(N)])
    stream.synchronize()
    if protocol == "dlpack":
        t = torch.from_dlpack(x)
    else:
        t = torch.as_tensor(x, device=f"cuda:{device.ordinal}")
    assert t.data_ptr() == x.ptr and t.dtype == torch.float32 and t.shape == (N,)
    np.testing.assert_array_equal(t.cpu().numpy(), 2 + np.arange(N, dtype=np.float32))
    t.add_(1)  # torch writes, we read
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.to_numpy(), 3 + np.arange(N, dtype=np.float32))


def test_bfloat16_exported_to_torch(device, torch_cuda):
    torch = torch_cuda
    bits = f32_to_bf16_bits(np.linspace(1, 2, 64, dtype=np.float32))
    x = device_array(device, (64,), dl.bfloat16).copy_from_host(bits)
    t = torch.from_dlpack(x)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == x.ptr
    np.testing.assert_array_equal(t.float().cpu().numpy(), bf16_bits_to_f32(bits))


@pytest.mark.parametrize("protocol", ["cai", "dlpack"])
def test_cupy_array_imported_without_copy(device, stream, selftest_module, cupy_cuda, protocol):
    cupy = cupy_cuda
    c = cupy.arange(N, dtype=cupy.float32) + 1
    cupy.cuda.Device(device.ordinal).synchronize()
    a = dl.runtime.as_device_array(c if protocol == "cai" else DLPackOnly(c))
    assert a.ptr == c.data.ptr and a.shape == (N,) and a.dtype == np.float32
    selftest_module.kernel("add_scalar_f32").launch(stream, grid(N), 256, [a, np.float32(0.5), np.int32(N)])
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(c), 1.5 + np.arange(N, dtype=np.float32))


@pytest.mark.parametrize("protocol", ["dlpack", "cai"])
def test_ours_exported_to_cupy(device, stream, selftest_module, cupy_cuda, protocol):
    cupy = cupy_cuda
    x = device_array(device, (N,), np.float32)
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(4), np.int32(N)])
    stream.synchronize()
    c = cupy.from_dlpack(x) if protocol == "dlpack" else cupy.asarray(x)
    assert c.data.ptr == x.ptr and c.dtype == cupy.float32 and c.shape == (N,)
    np.testing.assert_array_equal(cupy.asnumpy(c), 4 + np.arange(N, dtype=np.float32))


def test_cupy_array_as_a_kernel_argument(device, stream, selftest_module, cupy_cuda):
    cupy = cupy_cuda
    c = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device(device.ordinal).synchronize()
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [c, np.float32(9), np.int32(N)])
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(c), 9 + np.arange(N, dtype=np.float32))
