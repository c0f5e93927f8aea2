"""CUDA graphs on a GPU: capture, replay with changing device inputs, update, the capture
guard, the node audit, release order, two capturing threads, and the replay-latency benchmark's
measurement (run, not timed: replay latency is `driverlevel bench replay`'s, BENCHMARKS.md).
"""

from __future__ import annotations

import gc
import itertools
import math
import statistics
import threading
import weakref

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import bench_replay as br
from driverlevel import selftest
from threads_util import run_threads

pytestmark = pytest.mark.gpu

F32_NAN = 0x7FC00000
N = 300


def grid(n, block=256):
    return (math.ceil(n / block),)


def device_array(device, shape, dtype):
    nbytes = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
    return dl.DeviceBuffer.allocate(device, nbytes).as_array(shape, dtype)


def upload(device, host):
    host = np.ascontiguousarray(host)
    return device_array(device, host.shape, host.dtype).copy_from_host(host)


def iota(base, n=N):
    return base + np.arange(n, dtype=np.float32)


class Step:
    """A step that reads a device-side value: x[i] = *step + i + 1, then K-1 times x += 1."""

    def __init__(self, device, mod, pool, k=4, n=N, prefix="step"):
        self.n, self.k = n, k
        self.step = pool.carve(f"{prefix}.step", (1,), np.int32)
        self.x = pool.carve(f"{prefix}.x", (n,), np.float32)
        self.first = mod.kernel("copy_plus_one_from_device_scalar").prepare(grid(n), 256, [self.step, self.x, np.int32(n)])
        self.add = mod.kernel("add_scalar_f32").prepare(grid(n), 256, [self.x, np.float32(1.0), np.int32(n)])

    @staticmethod
    def pool_bytes(n=N):
        return dl.WorkspacePool.required_bytes([((1,), np.int32), ((n,), np.float32)])

    def launch(self, stream):
        self.first.launch(stream)
        for _ in range(self.k - 1):
            self.add.launch(stream)

    def expected(self, steps):
        steps = np.asarray(steps, np.int64).reshape(-1, 1)
        return (steps + np.arange(self.n)[None, :] + 1 + (self.k - 1)).astype(np.float32)


# -- capture and replay ---------------------------------------------------------------------------------
def test_replay_1000_times_while_a_device_input_changes(device, stream, selftest_module):
    replays = 1000
    pool = dl.WorkspacePool.allocate(device, Step.pool_bytes(), label="replay")
    s = Step(device, selftest_module, pool)
    steps_host = np.random.default_rng(5).integers(0, 1_000_000, replays).astype(np.int32)
    steps = upload(device, steps_host)  # every step's input, in device memory
    results = device_array(device, (replays, N), np.float32).fill_u32(F32_NAN, stream)
    with dl.capture(stream) as cap:
        s.launch(stream)
    assert [k.name for k in cap.graph.kernel_nodes()].count("add_scalar_f32") == s.k - 1
    ex = cap.graph.instantiate(upload_stream=stream)
    for i in range(replays):
        s.step.copy_from(steps[i:i + 1], stream)  # outside the capture: the new input, device to device
        ex.launch(stream)
        results[i].copy_from(s.x, stream)
    np.testing.assert_array_equal(results.to_numpy(stream), s.expected(steps_host))

    # the replay is bitwise what eager launches of the same kernels give
    s.x.fill_u32(F32_NAN, stream)
    s.step.copy_from(steps[7:8], stream)
    s.launch(stream)
    eager = s.x.to_numpy(stream)
    s.x.fill_u32(F32_NAN, stream)
    ex.launch(stream)
    assert eager.tobytes() == s.x.to_numpy(stream).tobytes()


def test_replay_on_another_stream_and_after_graph_close(device, stream, selftest_module):
    x = device_array(device, (N,), np.float32).fill_u32(F32_NAN, stream)
    with dl.capture(stream) as cap:
        selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(2), np.int32(N)])
    ex = cap.graph.instantiate()
    assert cap.graph.node_count() == 1
    cap.graph.close()  # the executable graph does not need it
    cap.graph.close()
    other = device.create_stream()
    ex.launch(other)
    np.testing.assert_array_equal(x.to_numpy(other), iota(2))
    ex.close()
    ex.close()


def test_empty_capture(device, stream):
    with dl.capture(stream) as cap:
        pass
    assert cap.graph.node_count() == 0 and cap.graph.kernel_nodes() == []


def test_capture_arguments_are_checked(device, stream):
    with pytest.raises(ValueError, match="capture mode must be one of"):
        with dl.capture(stream, mode="sloppy"):
            pass
    for legacy in (0, 1):  # the handle 0 and CU_STREAM_LEGACY
        with pytest.raises(dl.CaptureError, match="legacy default stream cannot be captured"):
            with dl.capture(dl.Stream.from_handle(legacy, device)):
                pass
    per_thread = dl.Stream.from_handle(2, device)  # CU_STREAM_PER_THREAD can be captured
    with dl.capture(per_thread) as cap:
        pass
    assert cap.graph.node_count() == 0
    with dl.capture(stream):
        with pytest.raises(dl.CaptureError, match="already being captured"):
            with dl.capture(stream):
                pass


@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_capture_modes(device, stream, selftest_module, mode):
    x = device_array(device, (N,), np.float32)
    with dl.capture(stream, mode=mode) as cap:
        selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(3), np.int32(N)])
    cap.graph.instantiate().launch(stream)
    np.testing.assert_array_equal(x.to_numpy(stream), iota(3))


# -- update -----------------------------------------------------------------------------------------------
def test_update_with_new_pointer_arguments(device, stream, selftest_module):
    fill = selftest_module.kernel("fill_iota_f32")
    a = device_array(device, (N,), np.float32).fill_u32(F32_NAN, stream)
    b = device_array(device, (N,), np.float32).fill_u32(F32_NAN, stream)
    with dl.capture(stream) as c1:
        fill.launch(stream, grid(N), 256, [a, np.float32(1), np.int32(N)])
    ex = c1.graph.instantiate()
    ex.launch(stream)
    np.testing.assert_array_equal(a.to_numpy(stream), iota(1))
    a.fill_u32(F32_NAN, stream)
    with dl.capture(stream) as c2:
        fill.launch(stream, grid(N), 256, [b, np.float32(7), np.int32(N)])
    ex.update(c2.graph)
    assert ex.graph is c2.graph  # the exec now keeps the new graph's arguments alive
    ex.launch(stream)
    np.testing.assert_array_equal(b.to_numpy(stream), iota(7))
    assert np.isnan(a.to_numpy(stream)).all()  # the old pointer is no longer written


def test_update_with_changed_topology_raises(device, stream, selftest_module):
    fill = selftest_module.kernel("fill_iota_f32")
    a = device_array(device, (N,), np.float32)
    with dl.capture(stream) as c1:
        fill.launch(stream, grid(N), 256, [a, np.float32(1), np.int32(N)])
    ex = c1.graph.instantiate()
    with dl.capture(stream) as c2:
        fill.launch(stream, grid(N), 256, [a, np.float32(1), np.int32(N)])
        fill.launch(stream, grid(N), 256, [a, np.float32(2), np.int32(N)])
    with pytest.raises(dl.GraphUpdateError) as ei:
        ex.update(c2.graph)
    e = ei.value
    assert isinstance(e, dl.CudaError) and e.call == "cuGraphExecUpdate"
    assert "TOPOLOGY_CHANGED" in str(e) and "capture again and instantiate a new GraphExec" in str(e)
    assert ex.graph is c1.graph


# -- the capture guard ---------------------------------------------------------------------------------------
def test_capture_guard_raises_and_the_capture_survives(device, stream, selftest_module):
    fill, add = selftest_module.kernel("fill_iota_f32"), selftest_module.kernel("add_scalar_f32")
    x = device_array(device, (N,), np.float32).fill_u32(F32_NAN, stream)
    ev = device.create_event()
    stream.synchronize()
    unsafe = [
        ("DeviceBuffer.allocate()", lambda: dl.DeviceBuffer.allocate(device, 1024)),
        ("DeviceBuffer.allocate()", lambda: dl.WorkspacePool.allocate(device, 1024)),
        ("PinnedHostBuffer.allocate()", lambda: dl.PinnedHostBuffer.allocate(device, 1024)),
        ("Stream.synchronize()", stream.synchronize),
        ("Device.synchronize()", device.synchronize),
        ("Event.synchronize()", ev.synchronize),
        ("DeviceArray.to_numpy()", x.to_numpy),
        ("DeviceArray.copy_from_host()", lambda: x.copy_from_host(np.zeros(N, np.float32))),
    ]
    with dl.capture(stream) as cap:
        fill.launch(stream, grid(N), 256, [x, np.float32(1), np.int32(N)])
        for what, call in unsafe:
            with pytest.raises(dl.CaptureError) as ei:
                call()
            msg = str(ei.value)
            assert msg.startswith(what) and "is not capture-safe" in msg, msg
            assert "being captured into a CUDA graph" in msg and "Do it before capture() begins" in msg, msg
            assert "WorkspacePool made up front" in msg and "or after the capture ends" in msg, msg
        assert stream.is_capturing()
        add.launch(stream, grid(N), 256, [x, np.float32(0.5), np.int32(N)])
    assert not stream.is_capturing()
    cap.graph.instantiate().launch(stream)
    np.testing.assert_array_equal(x.to_numpy(stream), iota(1.5))


def test_other_threads_may_allocate_during_a_thread_local_capture(device, stream, selftest_module):
    fill = selftest_module.kernel("fill_iota_f32")
    x = device_array(device, (N,), np.float32)

    def other_thread():
        y = device_array(device, (N,), np.float32)  # allocation + eager launch + readback, not capturing
        s = device.create_stream()
        fill.launch(s, grid(N), 256, [y, np.float32(4), np.int32(N)])
        return y.to_numpy(s)

    with dl.capture(stream) as cap:
        fill.launch(stream, grid(N), 256, [x, np.float32(5), np.int32(N)])
        (y,) = run_threads(other_thread)
    np.testing.assert_array_equal(y, iota(4))
    cap.graph.instantiate().launch(stream)
    np.testing.assert_array_equal(x.to_numpy(stream), iota(5))


def test_capture_invalidated_behind_our_back_raises(device, stream, selftest_module):
    x = device_array(device, (N,), np.float32)
    with pytest.raises(dl.CaptureError, match="invalidated"):
        with dl.capture(stream):
            selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(1), np.int32(N)])
            (err,) = driver.cuStreamSynchronize(stream.handle)  # prohibited, and not through driverlevel
            assert err != driver.CUresult.CUDA_SUCCESS
    assert not stream.is_capturing()
    selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [x, np.float32(6), np.int32(N)])
    np.testing.assert_array_equal(x.to_numpy(stream), iota(6))  # the stream works again


def test_exception_inside_capture_ends_it_cleanly(device, stream, selftest_module):
    x = device_array(device, (N,), np.float32)
    fill = selftest_module.kernel("fill_iota_f32")
    with pytest.raises(ZeroDivisionError):
        with dl.capture(stream):
            fill.launch(stream, grid(N), 256, [x, np.float32(1), np.int32(N)])
            1 / 0
    assert not stream.is_capturing() and stream._capture is None
    dl.DeviceBuffer.allocate(device, 256)  # the guard is released too
    with dl.capture(stream) as cap:
        fill.launch(stream, grid(N), 256, [x, np.float32(8), np.int32(N)])
    cap.graph.instantiate().launch(stream)
    np.testing.assert_array_equal(x.to_numpy(stream), iota(8))


# -- the node audit ------------------------------------------------------------------------------------------
def test_audit_lists_kernels_and_resolves_pointers(device, stream, selftest_module):
    pool = dl.WorkspacePool.allocate(device, 1 << 16, label="audit")
    step = pool.carve("audit.step", (1,), np.int32)
    x = pool.carve("audit.x", (N,), np.float32)
    y = pool.carve("audit.y", (N,), np.float32)
    with device.activated():  # raw driver calls need the context current (driverlevel leaves the caller's alone)
        raw = int(dl._errors.check("cuMemAlloc", driver.cuMemAlloc(N * 4)))  # memory driverlevel does not know
    try:
        stray = dl.DeviceArray(raw, (N,), np.float32, device)
        params = selftest.SaxpyParams(x=x.ptr, y=y.ptr, a=2.0, n=N, tag=0)
        with dl.capture(stream) as cap:
            selftest_module.kernel("copy_plus_one_from_device_scalar").launch(stream, grid(N), 256, [step, x, np.int32(N)])
            selftest_module.kernel("saxpy_params").launch(stream, grid(N), 256, [params])
            selftest_module.kernel("fill_iota_f32").launch(stream, grid(N, 128), 128, [stray, np.float32(1), np.int32(N)])
            y.fill_bytes(0, stream)  # a memset node: counted, not listed
        g = cap.graph
        assert g.node_count() == 4
        nodes = {k.name: k for k in g.kernel_nodes()}
        assert set(nodes) == {"copy_plus_one_from_device_scalar", "saxpy_params", "fill_iota_f32"}

        c = nodes["copy_plus_one_from_device_scalar"]
        assert (c.grid, c.block, c.shared_mem) == ((2, 1, 1), (256, 1, 1), 0)
        assert [(p.param, p.offset, p.address, p.owner, p.carve) for p in c.pointers] == [
            (0, 0, step.ptr, "audit", "audit.step"), (1, 0, x.ptr, "audit", "audit.x")]
        assert c.unregistered == []

        s = nodes["saxpy_params"]  # pointers inside a struct passed by value
        assert [(p.param, p.offset, p.carve) for p in s.pointers] == [(0, 0, "audit.x"), (0, 8, "audit.y")]

        f = nodes["fill_iota_f32"]
        assert (f.grid, f.block) == ((3, 1, 1), (128, 1, 1))
        assert [(p.address, p.owner, p.carve) for p in f.unregistered] == [(raw, None, None)]

        text = g.audit()
        assert text.splitlines()[0] == "3 kernel node(s) of 4 node(s):"
        assert "audit/audit.step" in text and "audit/audit.y" in text and "UNREGISTERED" in text
    finally:
        with device.activated():
            driver.cuMemFree(raw)


def test_audit_flags_a_cupy_array(device, stream, selftest_module):
    cupy = pytest.importorskip("cupy")
    c = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device(device.ordinal).synchronize()
    with dl.capture(stream) as cap:
        selftest_module.kernel("fill_iota_f32").launch(stream, grid(N), 256, [c, np.float32(1), np.int32(N)])
        cap.keep_alive(c)  # foreign memory: tie it to the graph explicitly
    (node,) = cap.graph.kernel_nodes()
    assert [(p.address, p.owner) for p in node.unregistered] == [(c.data.ptr, None)]
    cap.graph.instantiate().launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(c), iota(1))


# -- release order ----------------------------------------------------------------------------------------------
def _graph_into_pool(device, stream, mod, label):
    """(exec, graph, pool, out): a graph that fills a pool carve-out and accumulates it into ``out``."""
    out = device_array(device, (N,), np.float32).fill_bytes(0, stream)
    pool = dl.WorkspacePool.allocate(device, 4096, label=label)
    tmp = pool.carve("tmp", (N,), np.float32)
    fill = mod.kernel("fill_iota_f32").prepare(grid(N), 256, [tmp, np.float32(1), np.int32(N)])
    acc = mod.kernel("saxpy_f32").prepare(grid(N), 256, [np.float32(1), tmp, out, np.int32(N)])
    with dl.capture(stream) as cap:
        fill.launch(stream)
        acc.launch(stream)
    return cap.graph.instantiate(), cap.graph, pool, out


def test_graph_keeps_its_pool_alive(device, stream, selftest_module):
    ex, graph, pool, out = _graph_into_pool(device, stream, selftest_module, "kept")
    pool_ref, graph_ref = weakref.ref(pool), weakref.ref(graph)
    del pool, graph
    gc.collect()
    assert pool_ref() is not None and graph_ref() is not None  # held through the exec
    ex.launch(stream)
    ex.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), 2 * iota(1))
    del ex
    gc.collect()
    assert pool_ref() is None and graph_ref() is None


@pytest.mark.parametrize("order", list(itertools.permutations(["exec", "graph", "pool"])))
def test_release_in_any_order(device, stream, selftest_module, order):
    ex, graph, pool, out = _graph_into_pool(device, stream, selftest_module, "order")
    ex.launch(stream)
    stream.synchronize()
    refs = [weakref.ref(o) for o in (ex, graph, pool)]
    objs = {"exec": ex, "graph": graph, "pool": pool}
    del ex, graph, pool
    for name in order:
        del objs[name]
        gc.collect()
    assert all(r() is None for r in refs)
    np.testing.assert_array_equal(out.to_numpy(stream), iota(1))


@pytest.mark.parametrize("order", list(itertools.permutations(["exec", "graph", "pool"])))
def test_explicit_close_in_any_order(device, stream, selftest_module, order):
    ex, graph, pool, _ = _graph_into_pool(device, stream, selftest_module, "closed")
    ex.launch(stream)
    stream.synchronize()
    objs = {"exec": ex, "graph": graph, "pool": pool}
    refs = [weakref.ref(o) for o in (ex, graph, pool)]
    for name in order:
        objs[name].close()
    for name in order:
        objs[name].close()  # idempotent
    with pytest.raises(ValueError, match="this GraphExec was closed"):
        ex.launch(stream)  # a closed exec refuses to launch (its handle was destroyed)
    with pytest.raises(ValueError, match="this Graph was closed"):
        graph.instantiate()
    del ex, graph, pool, objs
    gc.collect()
    assert all(r() is None for r in refs)  # closing in any order leaves no reference cycle behind


# -- threads -------------------------------------------------------------------------------------------------
def test_two_threads_capture_and_replay_at_once(device, selftest_module):
    barrier = threading.Barrier(2, timeout=60)
    replays = 200

    def worker(idx):
        s = device.create_stream()
        pool = dl.WorkspacePool.allocate(device, Step.pool_bytes(), label=f"thread{idx}")
        step = Step(device, selftest_module, pool, k=2 + idx)
        steps_host = (np.arange(replays, dtype=np.int32) * 13 + 1000 * idx)
        steps = upload(device, steps_host)
        results = device_array(device, (replays, N), np.float32).fill_u32(F32_NAN, s)
        with dl.capture(s) as cap:  # thread_local: both threads capture at the same time
            barrier.wait()
            step.launch(s)
            barrier.wait()
        ex = cap.graph.instantiate()
        barrier.wait()
        for i in range(replays):  # and replay at the same time
            step.step.copy_from(steps[i:i + 1], s)
            ex.launch(s)
            results[i].copy_from(step.x, s)
        return results.to_numpy(s), step.expected(steps_host)

    for got, want in run_threads(lambda: worker(0), lambda: worker(1)):
        np.testing.assert_array_equal(got, want)


# -- the replay-latency benchmark (its numbers are BENCHMARKS.md's, not asserted here) -------------------------
def test_bench_replay_runs_every_variant_and_reports_consistent_rows(device):
    """`driverlevel bench replay`'s measurement at its smallest settings: every variant (driverlevel's replay,
    a bare cuGraphLaunch, eager launches) timed for every size, finite positive medians, ratios that are the
    medians' quotients. No timing is asserted: host-time ratios belong to the benchmark (the rule for this
    repository; they varied with the host's load)."""
    res = br.run(device.ordinal, counts=(1, 3), replays=br.MIN_REPLAYS, repeats=2, use_torch=False)
    assert [r.nodes for r in res["rows"]] == [1, 3] and res["replays"] == br.MIN_REPLAYS
    for r in res["rows"]:
        assert sorted(r.samples) == ["eager", "ours", "raw"] and all(len(v) == 2 for v in r.samples.values())
        for v in (r.ours_host_us, r.raw_host_us, r.eager_host_us_per_step, r.ours_gpu_us, r.eager_gpu_us_per_step):
            assert math.isfinite(v) and v > 0, r
        assert r.ours_host_us == statistics.median(r.samples["ours"])
        assert r.ours_over_raw == r.ours_host_us / r.raw_host_us and r.torch_host_us is None
        d = r.to_dict()
        assert d["eager_host_us_per_launch"] == r.eager_host_us_per_step / r.nodes
