"""Lifetime and context rules of the runtime on a GPU (issue 11: items 1, 2/7, 6, 11, 12b).

* Handles released during a capture (``del``, a cycle collected by ``gc.collect()``,
  ``close()``, from another thread, during a capture in another thread, during a
  capture driverlevel did not begin) never break it; the graph replays correctly.
* A graph keeps alive what it writes: launches queued on a side stream joined by
  events (fork/join), and pools reached only through raw addresses in kernel
  arguments; a replay works after every other Python reference is gone.
* Torch tensors imported inside ``torch.cuda.graph`` and under a non-default torch
  stream: no implicit synchronization, the torch capture stays valid.
* Every entry point works in the primary context with no context, or a foreign
  one, current; the caller's context is current again afterwards.
* ``copy_from_host()`` without a stream is complete before work on a
  non-blocking stream reads the data.

Data is never zero; outputs are poisoned with NaN before kernels write them.
"""

from __future__ import annotations

import ctypes
import gc
import math
import threading
import time
import weakref

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import _capture_guard, _module, selftest
from driverlevel._dtypes import bf16_bits_to_f32
from threads_util import run_threads

pytestmark = pytest.mark.gpu

F32_NAN = 0x7FC00000
SENTINEL = 0x5EA5EA5E
N = 1000
MODES = ["thread_local", "global", "relaxed"]
_MODE_ENUM = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}
OK = driver.CUresult.CUDA_SUCCESS


def grid(n, block=256):
    return (math.ceil(n / block),)


def device_array(device, shape, dtype=np.float32, label="test"):
    nbytes = max(int(np.prod(shape)) * dl._dtypes.as_dtype(dtype).itemsize, 1)
    return dl.DeviceBuffer.allocate(device, nbytes, label=label).as_array(shape, dtype)


def iota(base, n=N):
    return base + np.arange(n, dtype=np.float32)


def drv(call, ret):
    """Check a raw driver result in a test."""
    return dl._errors.check(call, ret)


def is_allocated(ptr: int) -> bool:
    """True while device address ``ptr`` lies in a live CUDA allocation."""
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    err, _ = driver.cuPointerGetAttribute(attr, ptr)
    return err == OK


def current_ctx() -> int:
    err, cur = driver.cuCtxGetCurrent()
    assert err == OK
    return int(cur)


def ctx_of_pointer(ptr: int) -> int:
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT
    return int(drv("cuPointerGetAttribute", driver.cuPointerGetAttribute(attr, ptr)))


# -- 1. handles released during a capture -------------------------------------------------------------
class Cycle:
    """A reference cycle holding a handle: only the cycle collector frees it."""

    def __init__(self, handle):
        self.handle = handle
        self.me = self


def make_handles(device):
    """One of each memory-owning type; returns (handles, device addresses to probe after the free)."""
    b = dl.DeviceBuffer.allocate(device, 1 << 20, label="drop.buffer")
    h = dl.PinnedHostBuffer.allocate(device, 1 << 16, label="drop.pinned")
    m = dl.PinnedHostBuffer.allocate(device, 1 << 16, mapped=True, label="drop.mapped")
    p = dl.WorkspacePool.allocate(device, 1 << 20, label="drop.pool")
    p.carve("x", (N,), np.float32)
    return [b, h, m, p], [b.ptr, p.base]


def release(handles, how):
    """Drop every handle in ``handles`` (a list the caller gives up) the way ``how`` says."""
    if how == "close":
        for x in handles:
            x.close()
        handles.clear()
    elif how == "del":
        handles.clear()  # the last references: finalizers run right here
    elif how == "cycle":
        cycles = [Cycle(x) for x in handles]
        handles.clear()
        cycles.clear()  # the last references to the cycles (``del cycles`` read as unused to pyflakes)
        gc.collect()
    elif how == "other_thread":
        box = [list(handles)]
        handles.clear()

        def drop():
            box.clear()
            gc.collect()

        run_threads(drop)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["del", "cycle", "close", "other_thread"])
@pytest.mark.parametrize("mode", MODES)
def test_handles_released_inside_a_capture_do_not_break_it(device, stream, selftest_module, mode, how):
    fill, add = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("add_scalar_f32")
    x = device_array(device, (N,), np.float32).fill_u32(F32_NAN, stream)
    handles, probes = make_handles(device)
    gc.collect()
    stream.synchronize()
    with dl.capture(stream, mode=mode) as cap:
        fill.launch(stream, grid(N), 256, [x, np.float32(1), np.int32(N)])
        release(handles, how)
        assert dl.runtime.deferred_count() >= 4  # nothing freed inside the capture
        add.launch(stream, grid(N), 256, [x, np.float32(0.5), np.int32(N)])
    assert dl.runtime.deferred_count() == 0  # freed when the capture ended
    assert not any(is_allocated(p) for p in probes)
    ex = cap.graph.instantiate()
    for _ in range(2):
        x.fill_u32(F32_NAN, stream)
        ex.launch(stream)
        np.testing.assert_array_equal(x.to_numpy(stream), iota(1.5))


@pytest.mark.parametrize("how", ["del", "cycle", "close"])
@pytest.mark.parametrize("mode", MODES)
def test_handles_released_while_another_thread_captures(device, selftest_module, mode, how):
    fill, add = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("add_scalar_f32")
    x = device_array(device, (N,), np.float32)
    handles, probes = make_handles(device)
    gc.collect()
    capturing, released = threading.Event(), threading.Event()

    def capture_thread():
        s = device.create_stream()
        with dl.capture(s, mode=mode) as cap:
            fill.launch(s, grid(N), 256, [x, np.float32(2), np.int32(N)])
            capturing.set()
            assert released.wait(60)
            add.launch(s, grid(N), 256, [x, np.float32(0.25), np.int32(N)])
        return s, cap.graph

    def main_side():
        assert capturing.wait(60)
        try:
            release(handles, how)  # in this (non-capturing) thread, during the other's capture
            assert dl.runtime.deferred_count() >= 4
        finally:
            released.set()

    (s, graph), _ = run_threads(capture_thread, main_side)
    assert dl.runtime.deferred_count() == 0 and not any(is_allocated(p) for p in probes)
    ex = graph.instantiate()
    x.fill_u32(F32_NAN, s)
    ex.launch(s)
    np.testing.assert_array_equal(x.to_numpy(s), iota(2.25))


def test_device_synchronize_in_another_thread_waits_for_a_capture(device, selftest_module):
    """Synchronizing a context while one of its streams captures invalidates the capture (any mode)."""
    fill, add = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("add_scalar_f32")
    x = device_array(device, (N,), np.float32)
    capturing = threading.Event()
    stamps = {}

    def capture_thread():
        s = device.create_stream()
        with dl.capture(s) as cap:  # thread_local
            fill.launch(s, grid(N), 256, [x, np.float32(4), np.int32(N)])
            capturing.set()
            time.sleep(0.3)  # the other thread asks for a device sync meanwhile
            add.launch(s, grid(N), 256, [x, np.float32(0.75), np.int32(N)])
            stamps["capture_end"] = time.perf_counter()
        return s, cap.graph

    def sync_thread():
        assert capturing.wait(60)
        device.synchronize()
        stamps["sync_done"] = time.perf_counter()

    (s, graph), _ = run_threads(capture_thread, sync_thread)
    assert stamps["sync_done"] >= stamps["capture_end"]
    graph.instantiate().launch(s)
    np.testing.assert_array_equal(x.to_numpy(s), iota(4.75))


@pytest.mark.parametrize("where", ["same_thread", "other_thread"])
@pytest.mark.parametrize("mode", MODES)
def test_handles_released_during_a_foreign_capture(device, selftest_module, mode, where):
    """A capture begun with the raw driver API: driverlevel cannot know it runs."""
    fill, add = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("add_scalar_f32")
    x = device_array(device, (N,), np.float32)
    handles, probes = make_handles(device)
    gc.collect()
    with device.activated():
        raw = drv("cuStreamCreate", driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    s = dl.Stream.from_handle(raw, device)
    try:
        with device.activated():
            drv("cuStreamBeginCapture", driver.cuStreamBeginCapture(raw, _MODE_ENUM[mode]))
        try:
            fill.launch(s, grid(N), 256, [x, np.float32(3), np.int32(N)])
            if where == "same_thread":
                release(handles, "del")
                gc.collect()
            else:
                release(handles, "other_thread")
            add.launch(s, grid(N), 256, [x, np.float32(0.5), np.int32(N)])
        finally:
            with device.activated():
                err, g = driver.cuStreamEndCapture(raw)
        assert err == OK, f"the foreign capture broke: {err!r}"
        dl.runtime.release_deferred()
        assert not any(is_allocated(p) for p in probes)
        with device.activated():
            ex = drv("cuGraphInstantiate", driver.cuGraphInstantiate(g, 0))
            x.fill_u32(F32_NAN, s)
            drv("cuGraphLaunch", driver.cuGraphLaunch(ex, raw))
            got = x.to_numpy(s)
            driver.cuGraphExecDestroy(ex)
            driver.cuGraphDestroy(g)
        np.testing.assert_array_equal(got, iota(3.5))
    finally:
        with device.activated():
            driver.cuStreamDestroy(raw)


# -- 2/7. a graph outlives what it writes -----------------------------------------------------------------
class Owner:
    """Stands for whatever owns foreign memory (a torch tensor, a plan)."""


@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_side_stream_launch_in_a_fork_join_capture_keeps_its_buffers(device, stream, selftest_module, mode):
    fill, saxpy = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("saxpy_f32")
    side = device.create_stream()
    out = device_array(device, (N,), np.float32)
    tmp = dl.DeviceBuffer.allocate(device, N * 4, label="side.tmp")
    owner = Owner()  # tied to the side launch only, through its argument's owner
    tmp_arr = dl.DeviceArray(tmp.ptr, (N,), np.float32, device, owner=(tmp, owner))
    refs = [weakref.ref(tmp), weakref.ref(owner)]
    fork, join = device.create_event(timing=False), device.create_event(timing=False)
    with dl.capture(stream, mode=mode) as cap:
        fork.record(stream)
        side.wait(fork)  # fork: the side stream joins the capture
        fill.launch(side, grid(N), 256, [tmp_arr, np.float32(3), np.int32(N)])
        saxpy.launch(side, grid(N), 256, [np.float32(1), tmp_arr, out, np.int32(N)])
        join.record(side)
        stream.wait(join)  # join
    ex = cap.graph.instantiate()
    del tmp, tmp_arr, owner, cap, fork, join
    gc.collect()
    assert all(r() is not None for r in refs), "the graph must keep the side stream's buffers alive"
    # New allocations of the same size (the allocator hands back a freed range first).
    sentinels = [dl.DeviceBuffer.allocate(device, N * 4).as_array((N,), np.uint32).fill_u32(SENTINEL, stream)
                 for _ in range(4)]
    for _ in range(3):
        out.fill_bytes(0, stream)
        ex.launch(stream)
        np.testing.assert_array_equal(out.to_numpy(stream), iota(3))
    for s in sentinels:
        assert (s.to_numpy(stream) == SENTINEL).all(), "a replay wrote into memory the graph does not own"
    del ex
    gc.collect()
    assert all(r() is None for r in refs)  # released with the graph


def _orphan_graph(device, stream, mod, out):
    """A graph over a pool that only raw addresses in kernel arguments point into.

    x = 5 + i; y = i; y = 2 x + y (a params struct by value); out += y.
    Returns the exec and a weak reference to the pool; every other object is dropped.
    """
    pool = dl.WorkspacePool.allocate(device, 1 << 16, label="orphan")
    x = pool.carve("x", (N,), np.float32)
    y = pool.carve("y", (N,), np.float32)
    raw_x, raw_y = ctypes.c_uint64(x.ptr), ctypes.c_uint64(y.ptr)  # addresses, not arrays: nothing kept
    launches = [
        mod.kernel("fill_iota_f32").prepare(grid(N), 256, [raw_x, np.float32(5), np.int32(N)]),
        mod.kernel("fill_iota_f32").prepare(grid(N), 256, [raw_y, np.float32(0), np.int32(N)]),
        mod.kernel("saxpy_params").prepare(grid(N), 256, [selftest.SaxpyParams(x=x.ptr, y=y.ptr, a=2.0, n=N, tag=0)]),
        mod.kernel("saxpy_f32").prepare(grid(N), 256, [np.float32(1), ctypes.c_uint64(y.ptr), out, np.int32(N)]),
    ]
    with dl.capture(stream) as cap:
        for ln in launches:
            ln.launch(stream)
    return cap.graph.instantiate(), weakref.ref(pool)


def test_replay_after_every_other_reference_is_gone(device, stream, selftest_module):
    out = device_array(device, (N,), np.float32)
    ex, pool_ref = _orphan_graph(device, stream, selftest_module, out)
    gc.collect()
    assert pool_ref() is not None, "the graph must keep the pool its kernel arguments point into"
    sentinels = [dl.DeviceBuffer.allocate(device, 1 << 16).as_array((1 << 14,), np.uint32).fill_u32(SENTINEL, stream)
                 for _ in range(4)]
    want = 2 * iota(5) + iota(0)
    for _ in range(3):
        out.fill_bytes(0, stream)
        ex.launch(stream)
        np.testing.assert_array_equal(out.to_numpy(stream), want)
    for s in sentinels:
        assert (s.to_numpy(stream) == SENTINEL).all()
    del ex
    gc.collect()
    assert pool_ref() is None


def test_prepared_launch_keep_ties_an_owner_to_the_graph(device, stream, selftest_module):
    out = device_array(device, (N,), np.float32)
    owner = Owner()
    ref = weakref.ref(owner)
    ln = selftest_module.kernel("fill_iota_f32").prepare(grid(N), 256, [out, np.float32(4), np.int32(N)])
    assert ln.keep(owner) is ln
    with dl.capture(stream) as cap:
        ln.launch(stream)
    ex = cap.graph.instantiate()
    del ln, owner, cap
    gc.collect()
    assert ref() is not None
    ex.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), iota(4))
    del ex
    gc.collect()
    assert ref() is None


def test_launches_inside_a_capture_become_nodes(device, stream, selftest_module):
    """Every launch inside a capture becomes one graph node (the capture-id lookup runs for each,
    one driver call, only while a driverlevel capture runs). The per-launch times are printed for
    information; speed is the benchmarks' business (``driverlevel bench replay``), not a test's."""
    ln = selftest_module.kernel("noop").prepare(1, 32, [])
    reps = 2000

    def per_launch_us():
        t0 = time.perf_counter()
        for _ in range(reps):
            ln.launch(stream)
        return (time.perf_counter() - t0) / reps * 1e6

    per_launch_us()
    eager = min(per_launch_us() for _ in range(3))
    stream.synchronize()
    with dl.capture(stream) as cap:
        captured = per_launch_us()
        t0 = time.perf_counter()
        for _ in range(reps):
            _capture_guard.capture_id(stream.handle)
        lookup = (time.perf_counter() - t0) / reps * 1e6
    print(f"launch: eager {eager:.2f} us, inside a capture {captured:.2f} us, "
          f"cuStreamGetCaptureInfo {lookup:.2f} us, {cap.graph.node_count()} nodes")
    assert cap.graph.node_count() == reps


# -- 6. interop under capture ---------------------------------------------------------------------------------
def test_torch_tensors_imported_inside_torch_graph(device, selftest_module, torch_cuda):
    torch = torch_cuda
    where = f"cuda:{device.ordinal}"
    x = torch.arange(N, dtype=torch.float32, device=where) + 1
    bf = torch.full((4, 576), 1.5, dtype=torch.bfloat16, device=where)
    i32 = torch.arange(9, dtype=torch.int32, device=where)
    i64 = torch.arange(9, dtype=torch.int64, device=where) * 3
    add = selftest_module.kernel("add_scalar_f32")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # torch's default: global capture mode
        s = dl.Stream.from_handle(torch.cuda.current_stream().cuda_stream, device)
        a, b, c, d = (dl.runtime.as_device_array(t) for t in (x, bf, i32, i64))
        add.launch(s, grid(N), 256, [a, np.float32(0.5), np.int32(N)])
        y = x * 2  # torch work after ours, in the same graph
    assert (a.ptr, a.dtype) == (x.data_ptr(), np.float32)
    assert b.dtype is dl.bfloat16 and b.ptr == bf.data_ptr() and b.shape == (4, 576)
    assert (c.ptr, c.dtype, c.shape) == (i32.data_ptr(), np.int32, (9,))  # no int64 copy of an int32 index
    assert (d.ptr, d.dtype, d.shape) == (i64.data_ptr(), np.int64, (9,))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), iota(1.5))
    np.testing.assert_array_equal(y.cpu().numpy(), 2 * iota(1.5))
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), iota(2.0))
    np.testing.assert_array_equal(bf16_bits_to_f32(b.to_numpy()), np.full((4, 576), 1.5, np.float32))


def test_handles_released_inside_torch_graph(device, selftest_module, torch_cuda):
    torch = torch_cuda
    x = torch.zeros(N, dtype=torch.float32, device=f"cuda:{device.ordinal}")
    handles, probes = make_handles(device)
    gc.collect()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s = dl.Stream.from_handle(torch.cuda.current_stream().cuda_stream, device)
        selftest_module.kernel("fill_iota_f32").launch(s, grid(N), 256, [x, np.float32(6), np.int32(N)])
        release(handles, "cycle")
        x.add_(1)
    dl.runtime.release_deferred()
    assert not any(is_allocated(p) for p in probes)
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), iota(7))


def test_torch_import_under_a_non_default_stream_inserts_no_wait(device, selftest_module, torch_cuda):
    torch = torch_cuda
    where = f"cuda:{device.ordinal}"
    x = torch.arange(N, dtype=torch.float32, device=where) + 1
    bf = torch.ones((4, 576), dtype=torch.bfloat16, device=where)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keep the side stream busy (~0.1 s)
        a, b = dl.runtime.as_device_array(x), dl.runtime.as_device_array(bf)
        # An implicit synchronization would have made the default stream wait for the side stream.
        default_idle = torch.cuda.default_stream().query()
        s = dl.Stream.from_handle(side.cuda_stream, device)
        selftest_module.kernel("add_scalar_f32").launch(s, grid(N), 256, [a, np.float32(0.5), np.int32(N)])
    side.synchronize()
    assert default_idle, "importing a tensor made torch's default stream wait on the current stream"
    assert b.ptr == bf.data_ptr() and b.dtype is dl.bfloat16
    np.testing.assert_array_equal(x.cpu().numpy(), iota(1.5))


# -- 11. the current context ------------------------------------------------------------------------------------
def pop_all_contexts() -> list:
    popped = []
    while current_ctx():
        popped.append(drv("cuCtxPopCurrent", driver.cuCtxPopCurrent()))
    return popped


def push_back(popped) -> None:
    for c in reversed(popped):
        drv("cuCtxPushCurrent", driver.cuCtxPushCurrent(c))


def create_foreign_context(device):
    """A new (non-primary) context on ``device``, made current in this thread."""
    try:
        return drv("cuCtxCreate", driver.cuCtxCreate(None, 0, device._dev))  # CUDA 13 bindings
    except TypeError:
        return drv("cuCtxCreate", driver.cuCtxCreate(0, device._dev))


def exercise(device, mod):
    """Every kind of entry point once; returns what the checks need."""
    s = device.create_stream()
    ev = device.create_event()
    buf = dl.DeviceBuffer.allocate(device, N * 4, label="ctx.buffer")
    pool = dl.WorkspacePool.allocate(device, 1 << 16, label="ctx.pool")
    pinned = dl.PinnedHostBuffer.allocate(device, 4096, mapped=True)
    x = buf.as_array((N,), np.float32).copy_from_host(iota(10))
    y = pool.carve("y", (N,), np.float32).fill_u32(F32_NAN, s)
    y.copy_from(x, s)
    mod.kernel("add_scalar_f32").launch(s, grid(N), 256, [y, np.float32(1), np.int32(N)])
    ev.record(s)
    ev.synchronize()
    assert ev.query()
    with dl.capture(s) as cap:
        mod.kernel("add_scalar_f32").launch(s, grid(N), 256, [y, np.float32(0.5), np.int32(N)])
    ex = cap.graph.instantiate(upload_stream=s)
    ex.launch(s)
    ex.launch(s)
    s.synchronize()
    device.synchronize()
    assert device.mem_info()[0] > 0
    assert len(cap.graph.kernel_nodes()) == 1
    return dict(y=y.to_numpy(s), buf=buf, pool=pool, pinned=pinned, stream=s)


def check_primary(device, got):
    np.testing.assert_array_equal(got["y"], iota(12))
    primary = int(device.context)
    assert ctx_of_pointer(got["buf"].ptr) == primary
    assert ctx_of_pointer(got["pool"].base) == primary
    assert int(drv("cuStreamGetCtx", driver.cuStreamGetCtx(got["stream"].handle))) == primary


def test_calls_with_no_context_current(device, selftest_module):
    popped = pop_all_contexts()
    try:
        assert current_ctx() == 0
        got = exercise(device, selftest_module)
        assert current_ctx() == 0, "an entry point left a context current"
        check_primary(device, got)
        got = run_threads(lambda: exercise(device, selftest_module))[0]  # a fresh thread: nothing current either
        check_primary(device, got)
    finally:
        push_back(popped)


def test_calls_with_a_foreign_context_current(device, selftest_module):
    saved = dict(_module._module_cache)
    _module._module_cache.clear()  # the next load happens while the foreign context is current
    ctx = create_foreign_context(device)
    destroyed = False
    try:
        foreign = int(ctx)
        assert current_ctx() == foreign
        mod = selftest.load(device)
        assert current_ctx() == foreign
        got = exercise(device, mod)
        assert current_ctx() == foreign, "the caller's context must be current again"
        check_primary(device, got)
        drv("cuCtxDestroy", driver.cuCtxDestroy(ctx))
        destroyed = True
        # The module (and the cached one later plans get) lives in the primary context:
        # it still works after the foreign context is gone.
        assert selftest.load(device) is mod
        s = device.create_stream()
        x = device_array(device, (N,), np.float32).fill_u32(F32_NAN, s)
        mod.kernel("fill_iota_f32").launch(s, grid(N), 256, [x, np.float32(8), np.int32(N)])
        np.testing.assert_array_equal(x.to_numpy(s), iota(8))
    finally:
        if not destroyed:
            driver.cuCtxDestroy(ctx)
        _module._module_cache.clear()
        _module._module_cache.update(saved)


# -- 12b. copy_from_host without a stream ----------------------------------------------------------------------
def test_copy_from_host_is_complete_before_work_on_a_non_blocking_stream(device, stream):
    n, m = 32 << 20, 1 << 16  # 128 MB of pageable memory; check the last 256 KB
    dst = device_array(device, (n,), np.float32)
    tail = device_array(device, (m,), np.float32)
    for k in range(1, 6):
        host = np.full(n, float(k), np.float32)
        dst.copy_from_host(host)  # no stream
        tail.copy_from(dst[n - m:], stream)  # right away, on a non-blocking stream
        host[:] = -1.0  # the source may be reused at once
        del host
        np.testing.assert_array_equal(tail.to_numpy(stream), np.full(m, float(k), np.float32))
