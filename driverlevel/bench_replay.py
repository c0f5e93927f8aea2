"""Graph-replay latency benchmark: host µs per replay of a graph of 1, 10 and 50 trivial kernels.

Measured side by side in one run, on one device, for the same graphs:

* ``ours``  — :meth:`driverlevel.runtime.GraphExec.launch` (the replay every decode step uses);
* ``raw``   — a bare loop of ``cuda.bindings.driver.cuGraphLaunch`` on the same exec
  (the floor for any Python caller of the driver API);
* ``torch`` — ``torch.cuda.CUDAGraph.replay()`` of the same kernels captured through
  PyTorch (only if torch with CUDA is installed; imported here and nowhere else);
* ``eager`` — the same kernels launched one by one (:meth:`PreparedLaunch.launch` × N).

Host time is "burst" time: ``time.perf_counter`` around a loop of a few dozen calls that
never fills the launch queue (the device is synchronized before every burst, outside
the timed region). GPU time per replay comes from events around a burst queued behind
a spin kernel, so the GPU runs the burst back to back. Every number is a median over
``repeats`` repetitions; each repetition makes ``replays`` calls per variant.

Run ``driverlevel bench replay`` or ``python benchmarks/bench_replay.py``; the target is
ours/raw <= 1.25 and ours/torch <= 1.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["ReplayRow", "measure_host_us", "measure_gpu_us", "graph_burst", "raw_burst", "eager_burst", "build", "run",
           "format_table", "to_json",
           "main_from_options", "parse_node_counts", "options_problem", "MIN_REPLAYS", "MAX_REPLAYS", "MAX_REPEATS",
           "MAX_NODES"]

TARGET_OURS_OVER_RAW = 1.25

#: Bounds of ``--replays`` (calls per variant and repetition), ``--repeats`` and each ``--nodes`` count (kernels
#: per graph). Past them a run lasts hours (four variants x every size x replays x repeats) or builds graphs of
#: more kernels than a replay-latency measurement needs: 10**9 replays ran for days.
MIN_REPLAYS, MAX_REPLAYS = 100, 1_000_000
MAX_REPEATS = 100
MAX_NODES = 1_000


def options_problem(replays: int, repeats: int, counts=(), prefix: str = "--") -> str | None:
    """What is wrong with ``replays``, ``repeats`` and the kernel ``counts`` (each 1 to :data:`MAX_NODES`), in
    one line naming the option (``prefix`` + its name: ``"--replays"`` for the command lines, ``"replays"`` for
    :func:`run`); None when nothing is. Bounds: :data:`MIN_REPLAYS` to :data:`MAX_REPLAYS` replays, 1 to
    :data:`MAX_REPEATS` repeats."""
    r, p, n = f"{prefix}replays", f"{prefix}repeats", f"{prefix}nodes" if prefix else "counts"
    if replays < MIN_REPLAYS or repeats < 1:
        return f"{r} must be >= {MIN_REPLAYS} and {p} >= 1, got {replays} and {repeats}"
    if replays > MAX_REPLAYS:
        return f"{r} must be <= {MAX_REPLAYS:,} (calls per variant and repetition), got {replays:,}"
    if repeats > MAX_REPEATS:
        return f"{p} must be <= {MAX_REPEATS}, got {repeats:,}"
    for c in counts:
        if not 1 <= c <= MAX_NODES:
            return f"{n}: kernel counts must be 1 to {MAX_NODES:,} per graph, got {c:,}"
    return None


def parse_node_counts(text: str) -> list[int]:
    """``--nodes``: ``"1,10,50"`` -> ``[1, 10, 50]`` (the CLI's and ``benchmarks/bench_replay.py``'s).

    Raises
    ------
    ValueError
        For an empty list, an empty item (``"1,,2"``, ``"1,"``: refused, as ``capture-demo
        --devices`` refuses one, not dropped), a non-integer, an integer < 1 or one above
        :data:`MAX_NODES`. Every message names what is wrong, then the same hint:
        ``"empty item in '1,,2': give kernel counts 1 to 1,000 separated by single commas, e.g. 1,10,50"``.
    """
    hint = f"give kernel counts 1 to {MAX_NODES:,} separated by single commas, e.g. 1,10,50"
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError(f"no kernel counts in {text!r}: {hint}")
    if not all(parts):
        raise ValueError(f"empty item in {text!r}: {hint}")
    where = f" in {text!r}" if len(parts) > 1 else ""  # ("'abc' is not an integer", not "'abc' in 'abc' ...")
    counts = []
    for p in parts:
        try:
            counts.append(int(p))
        except ValueError:
            raise ValueError(f"{p!r}{where} is not an integer: {hint}") from None
    for c in counts:
        if not 1 <= c <= MAX_NODES:
            raise ValueError(f"{c:,}{where} is {'below 1' if c < 1 else f'above {MAX_NODES:,} kernels per graph'}: {hint}")
    return counts


def graph_burst_size(nodes: int) -> int:
    """Replays per timed burst: at most ~500 queued kernel nodes, so the queue never fills."""
    return max(4, min(100, 500 // nodes))


def eager_burst_size(nodes: int) -> int:
    """Eager steps (``nodes`` launches each) per timed burst: at most ~500 queued launches."""
    return max(2, min(100, 500 // nodes))


def measure_host_us(burst_fn, calls: int, burst: int, sync) -> float:
    """Mean host µs per call of ``burst_fn(b)`` (which makes ``b`` calls), in bursts of ``burst``.

    ``sync()`` runs before every burst and after the last one, outside the timed region.
    """
    pc = time.perf_counter
    total, done = 0.0, 0
    while done < calls:
        b = min(burst, calls - done)
        sync()
        t0 = pc()
        burst_fn(b)
        total += pc() - t0
        done += b
    sync()
    return total * 1e6 / calls


def measure_gpu_us(burst_fn, burst: int, stream, spin, start, end, host_us: float, samples: int = 5) -> float:
    """Median GPU µs per call: events around ``burst`` calls queued behind a spin kernel.

    ``spin`` is a prepared ``spin_wait_ns`` launch whose argument 0 is set here to a
    wait three times longer than the host needs to queue the burst.
    """
    ns = int(max(100_000, 3 * burst * host_us * 1_000))
    spin.set_arg(0, np.int64(ns))
    out = []
    for _ in range(samples):
        stream.synchronize()
        spin.launch(stream)
        start.record(stream)
        burst_fn(burst)
        end.record(stream)
        end.synchronize()
        out.append(start.elapsed_ms(end) * 1e3 / burst)
    return statistics.median(out)


def graph_burst(exec_, stream):
    """``burst_fn`` replaying ``exec_`` on ``stream`` through driverlevel."""
    launch = exec_.launch

    def run(b):
        for _ in range(b):
            launch(stream)

    return run


def raw_burst(exec_, stream):
    """``burst_fn`` calling ``cuGraphLaunch`` directly on the same exec (no checks)."""
    from cuda.bindings import driver

    f, h, s = driver.cuGraphLaunch, exec_.handle, stream.handle

    def run(b):
        for _ in range(b):
            f(h, s)

    return run


def eager_burst(launches, stream):
    """``burst_fn`` making ``b`` eager steps, each launching every prepared launch once."""
    fns = [p.launch for p in launches]

    def run(b):
        for _ in range(b):
            for f in fns:
                f(stream)

    return run


@dataclass
class ReplayRow:
    """One graph size's medians (µs) and ratios."""

    nodes: int
    ours_host_us: float
    raw_host_us: float
    eager_host_us_per_step: float
    ours_gpu_us: float
    eager_gpu_us_per_step: float
    torch_host_us: float | None = None
    torch_gpu_us: float | None = None
    samples: dict = field(default_factory=dict)

    @property
    def ours_over_raw(self) -> float:
        return self.ours_host_us / self.raw_host_us

    @property
    def ours_over_torch(self) -> float | None:
        return None if self.torch_host_us is None else self.ours_host_us / self.torch_host_us

    @property
    def eager_over_ours(self) -> float:
        return self.eager_host_us_per_step / self.ours_host_us

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ours_over_raw=self.ours_over_raw, ours_over_torch=self.ours_over_torch,
                 eager_over_ours=self.eager_over_ours,
                 eager_host_us_per_launch=self.eager_host_us_per_step / self.nodes)
        return d


def build(dev, stream, nodes: int):
    """Prepared ``noop`` launches and an instantiated, uploaded graph of ``nodes`` of them."""
    from ._graph import capture
    from .selftest import load

    kernel = load(dev).kernel("noop")
    launches = [kernel.prepare(1, 32, []) for _ in range(nodes)]
    with capture(stream) as cap:
        for p in launches:
            p.launch(stream)
    exec_ = cap.graph.instantiate(upload_stream=stream)
    return launches, cap.graph, exec_


def _torch_peer(dev, launches, use_torch: bool):
    """``(torch, graph, side_stream, side_stream_as_ours)`` or None when torch+CUDA is absent."""
    if not use_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from ._stream import Stream

    torch.cuda.set_device(dev.ordinal)
    dev.set_current()
    side = torch.cuda.Stream(device=dev.ordinal)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        cap_stream = Stream.from_handle(torch.cuda.current_stream().cuda_stream, dev)
        for p in launches:
            p.launch(cap_stream)
    return torch, g, side, Stream.from_handle(side.cuda_stream, dev)


def run(ordinal: int = 0, counts=(1, 10, 50), replays: int = 10_000, repeats: int = 5, use_torch: bool = True,
        progress=None) -> dict:
    """Run the benchmark; returns a dict with the environment and one :class:`ReplayRow` per size.

    Raises
    ------
    ValueError
        Before the device is touched, for ``replays`` outside :data:`MIN_REPLAYS` to :data:`MAX_REPLAYS`,
        ``repeats`` outside 1 to :data:`MAX_REPEATS`, or a count outside 1 to :data:`MAX_NODES`
        (:func:`options_problem`).
    """
    problem = options_problem(replays, repeats, counts, prefix="")
    if problem:
        raise ValueError(problem)
    from ._device import Device, driver_version
    from .selftest import load

    dev = Device(ordinal)
    stream = dev.create_stream()
    start, end = dev.create_event(), dev.create_event()
    spin = load(dev).kernel("spin_wait_ns").prepare(1, 32, [np.int64(0)])
    sync = dev.synchronize
    torch_version = None
    rows = []
    for n in counts:
        launches, graph, exec_ = build(dev, stream, n)
        peer = _torch_peer(dev, launches, use_torch)
        gb, eb = graph_burst_size(n), eager_burst_size(n)
        variants = {
            "ours": (graph_burst(exec_, stream), gb),
            "raw": (raw_burst(exec_, stream), gb),
            "eager": (eager_burst(launches, stream), eb),
        }
        if peer is not None:
            torch, tg, side, side_ours = peer
            torch_version = torch.__version__
            replay = tg.replay

            def torch_burst(b, replay=replay):
                for _ in range(b):
                    replay()

            variants["torch"] = (torch_burst, gb)
        host = {k: [] for k in variants}
        for k, (fn, b) in variants.items():  # warm-up
            _with_torch_stream(peer, k, lambda fn=fn, b=b: measure_host_us(fn, 4 * b, b, sync))
        for rep in range(repeats):
            for k, (fn, b) in variants.items():
                host[k].append(_with_torch_stream(peer, k, lambda fn=fn, b=b: measure_host_us(fn, replays, b, sync)))
            if progress:
                progress(f"nodes={n} repetition {rep + 1}/{repeats}: "
                         + ", ".join(f"{k} {v[-1]:.2f} µs" for k, v in host.items()))
        med = {k: statistics.median(v) for k, v in host.items()}
        ours_gpu = measure_gpu_us(variants["ours"][0], gb, stream, spin, start, end, med["ours"])
        eager_gpu = measure_gpu_us(variants["eager"][0], eb, stream, spin, start, end, med["eager"])
        torch_gpu = None
        if peer is not None:
            torch_gpu = _with_torch_stream(peer, "torch", lambda: measure_gpu_us(
                variants["torch"][0], gb, side_ours, spin, start, end, med["torch"]))
        rows.append(ReplayRow(n, med["ours"], med["raw"], med["eager"], ours_gpu, eager_gpu,
                              med.get("torch"), torch_gpu, samples=host))
        del exec_, graph, peer
    props = dev.properties
    return {
        "device": props.name, "arch": props.arch, "driver_cuda": "%d.%d" % driver_version(),
        "torch": torch_version, "replays": replays, "repeats": repeats,
        "target_ours_over_raw": TARGET_OURS_OVER_RAW, "rows": rows,
    }


def _with_torch_stream(peer, variant, fn):
    """Run ``fn`` with torch's current stream set to the peer's side stream for the torch variant."""
    if peer is None or variant != "torch":
        return fn()
    torch, _, side, _ = peer
    prev = torch.cuda.current_stream()
    torch.cuda.set_stream(side)
    try:
        return fn()
    finally:
        torch.cuda.set_stream(prev)


def _f(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def format_table(result: dict) -> str:
    """The human-readable table of :func:`run`'s result."""
    head = (f"graph replay latency on {result['device']} ({result['arch']}, driver CUDA {result['driver_cuda']}, "
            f"torch {result['torch'] or 'not measured'}); medians of {result['repeats']} x {result['replays']:,} calls\n")
    cols = ("nodes", "ours µs", "raw µs", "torch µs", "ours/raw", "ours/torch", "eager µs/step", "eager µs/launch",
            "eager/ours", "GPU µs ours", "GPU µs torch", "GPU µs eager")
    lines = []
    for r in result["rows"]:
        lines.append((str(r.nodes), _f(r.ours_host_us), _f(r.raw_host_us), _f(r.torch_host_us),
                      _f(r.ours_over_raw), _f(r.ours_over_torch), _f(r.eager_host_us_per_step),
                      _f(r.eager_host_us_per_step / r.nodes), _f(r.eager_over_ours, ".1f"), _f(r.ours_gpu_us),
                      _f(r.torch_gpu_us), _f(r.eager_gpu_us_per_step)))
    widths = [max(len(c), *(len(x[i]) for x in lines)) for i, c in enumerate(cols)]
    out = [head + "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    out += ["  ".join(v.rjust(w) for v, w in zip(x, widths)) for x in lines]
    worst = max(r.ours_over_raw for r in result["rows"])
    out.append(f"ours/raw worst {worst:.2f} (target <= {TARGET_OURS_OVER_RAW}): "
               f"{'met' if worst <= TARGET_OURS_OVER_RAW else 'MISSED'}")
    return "\n".join(out)


def to_json(result: dict) -> str:
    d = dict(result)
    d["rows"] = [r.to_dict() for r in result["rows"]]
    return json.dumps(d, indent=2)


def main_from_options(counts, replays, repeats, ordinal, use_torch, json_path) -> int:
    """Entry point shared by ``driverlevel bench replay`` and ``benchmarks/bench_replay.py``; returns the
    exit status.

    The ``--json`` path is checked first (2 with one line on stderr if it cannot be written), then
    the GPU: without one, the no-GPU sentence goes to stderr and, with ``json_path == "-"``, the
    object ``{"error": ..., "exit_status": 2}`` to stdout, as ``capture-demo --json`` does; 2. An
    ordinal past the visible GPUs is 2 too (with the same JSON object). All before anything is
    measured.
    """
    from ._cli_common import json_path_problem, report_error, report_no_gpu
    from ._device import device_count, gpu_usable

    # Usage errors found before the minutes of measuring, not as a traceback after them.
    problem = json_path_problem(json_path)
    if problem:
        print(f"--json {json_path}: {problem}", file=sys.stderr)
        return 2
    if not gpu_usable():
        return report_no_gpu(json_to_stdout=json_path == "-")
    n = device_count()
    if ordinal >= n:
        return report_error(f"--device {ordinal}: only {n} GPU(s) visible (ordinals 0 to {n - 1})",
                            json_to_stdout=json_path == "-")
    result = run(ordinal, counts, replays, repeats, use_torch, progress=lambda s: print(s, file=sys.stderr))
    problem = write_result(result, json_path)
    if problem:
        return report_error(f"--json {json_path}: {problem}")
    return 0


def write_result(result: dict, json_path) -> str | None:
    """The table and, with ``json_path``, the JSON. ``json_path == "-"`` puts the JSON alone on stdout
    (so ``| jq`` reads it) and the table on stderr, as ``capture-demo --json`` does with its log.
    Returns why the JSON file could not be written (:func:`~driverlevel._cli_common.write_json_file`:
    whole or not at all), or None."""
    json_to_stdout = json_path == "-"
    print(format_table(result), file=sys.stderr if json_to_stdout else sys.stdout)
    if json_path:
        text = to_json(result)
        if json_to_stdout:
            print(text)
        else:
            from ._cli_common import write_json_file

            return write_json_file(json_path, text + "\n")
    return None


if __name__ == "__main__":  # the module behind `driverlevel bench replay`, not a script of its own
    print("driverlevel.bench_replay is run as `driverlevel bench replay` (see `driverlevel bench replay --help`)",
          file=sys.stderr)
    sys.exit(2)
