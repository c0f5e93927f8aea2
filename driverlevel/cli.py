"""The ``driverlevel`` command line: ``info``, ``compile``, ``capture-demo`` and ``bench``.

``info`` and ``compile`` work on a machine without a GPU (``compile`` needs only
NVRTC). ``bench`` is a group: ``bench replay`` lives here, other benchmarks add
their own subcommands to :data:`bench`.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import re
import sys
import time
import warnings as pywarnings
from pathlib import Path

import click

from . import __version__
from ._cli_common import is_output_failure, json_path_problem, json_usage_errors
from ._compile import (MAX_SHARED_PER_BLOCK, SUPPORTED_ARCHS, CompileVariant, check_arch, check_arch_list,
                       check_compile_env, compile_file, kernel_source_dir, kernel_sources, nvrtc_version)
from ._device import Device, device_count, driver_version, init_driver
from ._errors import CudaError, DriverUnavailableError, NvrtcError
from .bench_replay import MAX_NODES, MAX_REPEATS, MAX_REPLAYS, MIN_REPLAYS
from .demo.capture_demo import capture_demo
from .verify_attention import _old_nvrtc_hint

__all__ = ["main", "bench", "compile_variants", "LAUNCHERS"]


def _output_failed(exc: OSError) -> None:
    """Re-raise ``exc`` unless it is a failure to write standard output; otherwise say so in one
    line on stderr (stdout's unwritten buffer dropped, so that exit does not fail on it again)."""
    if not is_output_failure(exc):
        raise exc
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    try:
        click.echo(f"driverlevel: cannot write the output: {exc.strerror or exc}", err=True)
    except OSError:
        pass


class _ClosedStdout(io.TextIOBase):
    """``sys.stdout`` when Python started with descriptor 1 closed: every write raises the
    ``OSError`` (EBADF) that writing to the closed descriptor would."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


class _Group(click.Group):
    """The command group; a Ctrl-C is one line on stderr and exit status 130; a failure to write
    standard output (``> /dev/full``, a closed pipe, a closed descriptor) is one line on stderr and
    exit status 2, not a traceback (status 1 means a kernel failed to compile):
    in a command (``invoke``) and in the group's own ``--help`` and ``--version``, which click
    prints while it parses the arguments (``make_context``)."""

    def make_context(self, info_name, args, parent=None, **extra):
        if parent is None and sys.stdout is None:  # `driverlevel ... >&-`: Python found fd 1 closed
            # A stand-in whose writes fail as a closed descriptor's would: what goes to stdout ends in
            # _output_failed's one line, and what goes to stderr (a usage error, the no-GPU
            # sentence) is still said, which refusing every command up front hid.
            sys.stdout = _ClosedStdout()
        if parent is None and sys.stderr is None:  # `driverlevel ... 2>&-`: Python found fd 2 closed
            # What goes to stderr (the progress bar's terminal test, warnings, the no-GPU sentence) is dropped,
            # as the caller asked; print(file=None) would write it to stdout, ahead of a table or JSON.
            sys.stderr = open(os.devnull, "w", encoding="utf-8")
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except OSError as exc:
            _output_failed(exc)
            raise click.exceptions.Exit(2) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as exc:
            _output_failed(exc)
            ctx.exit(2)
        except KeyboardInterrupt:
            # Ctrl-C: exit status 130 (128 + SIGINT, as a shell reports it), which a script can tell
            # from a failed compile's 1 (click's own handling printed "Aborted!" and exited 1)
            click.echo("driverlevel: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="driverlevel", message="%(prog)s %(version)s")
def main():
    """driverlevel: MLA verify attention for draft trees and the DDTree decode loop as CUDA graphs.

    Kernels are compiled by NVRTC to cubin for the GPU's exact architecture and
    launched through the CUDA driver API; no PyTorch at run time.
    """


# -- info --------------------------------------------------------------------------------
def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


@main.command(short_help="Driver, NVRTC and GPU facts (no GPU needed).")
def info():
    """Driver and NVRTC versions, and each GPU's name, compute capability, SMs,
    shared memory, L2 and memory.

    Without a GPU or an NVIDIA driver it says so in one sentence and exits 0.
    """
    click.echo(f"driverlevel {__version__}")
    try:
        major, minor = nvrtc_version()
        known = ", ".join(sorted(MAX_SHARED_PER_BLOCK, key=lambda a: int(a[3:])))
        click.echo(f"NVRTC {major}.{minor} (kernels compile to cubin for {known}; --arch all: {', '.join(SUPPORTED_ARCHS)})")
    except Exception as exc:  # NVRTC missing: still report the driver side
        click.echo(f"NVRTC unavailable: {exc}")
    n, drv, reason = 0, None, ""
    try:  # which of the three it is: no driver library, a driver that fails, no device
        init_driver()
        n = device_count()
        drv = driver_version() if n else None
        why = "the CUDA driver sees no device (CUDA_VISIBLE_DEVICES may hide them)"
    except DriverUnavailableError as exc:  # (before CudaError: a subclass) no libcuda, or no device at cuInit
        n, why = 0, str(exc)
    except CudaError as exc:  # (also one from driver_version after a count: no GPU is reported then)
        n, reason = 0, f" ({exc.name})"
        why = "the CUDA driver is installed but failed to initialise"
    if n == 0:
        click.echo(f"No NVIDIA GPU is usable on this machine{reason}: {why} "
                   f"(kernels can still be compiled with `driverlevel compile`).")
        return
    click.echo(f"CUDA driver supports CUDA {drv[0]}.{drv[1]}; {n} GPU(s):")
    for i in range(n):
        dev = Device(i)
        p = dev.properties
        free, total = dev.mem_info()
        click.echo(
            f"  [{i}] {p.name}: compute capability {p.compute_capability[0]}.{p.compute_capability[1]} ({p.arch}), "
            f"{p.sm_count} SMs, shared memory per block {p.max_shared_memory_per_block_optin:,} B opt-in "
            f"({p.max_shared_memory_per_block:,} B default), L2 {_mib(p.l2_cache_bytes)}, "
            f"memory {_mib(free)} free of {_mib(total)}"
        )


# -- compile -----------------------------------------------------------------------------
#: The launcher module of every kernel source in ``cu/``: the module that compiles and launches
#: it, and declares how in ``compile_variants(arch) -> list[CompileVariant]``.
LAUNCHERS = {
    "verify_attention.cu": "driverlevel.verify_attention",
    "ddtree.cu": "driverlevel.ddtree",
    "runner.cu": "driverlevel.runner",
    "argmax.cu": "driverlevel.argmax",
    "mla_model.cu": "driverlevel.demo.mla_model",
    "selftest.cu": "driverlevel.selftest",
}


def compile_variants(filename: str, arch: str) -> list[CompileVariant]:
    """Every way ``filename`` is compiled and launched on ``arch``, as its launcher declares.

    The launcher is :data:`LAUNCHERS`' module for ``filename``; its
    ``compile_variants(arch)`` gives the variants (defines and the most dynamic shared
    memory per kernel).

    Raises
    ------
    LookupError
        If ``filename`` has no registered launcher, or the launcher declares no ``compile_variants``.
    """
    name = LAUNCHERS.get(filename)
    if name is None:
        raise LookupError(f"{filename} has no launcher registered in driverlevel.cli.LAUNCHERS")
    mod = importlib.import_module(name)
    if not hasattr(mod, "compile_variants"):
        raise LookupError(f"{name} declares no compile_variants(arch)")
    return list(mod.compile_variants(arch))


_COLUMNS = ("file", "kernel", "arch", "regs", "static smem", "dynamic smem", "smem limit", "headroom", "stack",
            "spill B", "cache", "")
_RIGHT = {3, 4, 5, 6, 7, 8, 9}


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]

    def fmt(r):
        return "  ".join((str(v).rjust(w) if i in _RIGHT else str(v).ljust(w))
                         for i, (v, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([fmt(_COLUMNS), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _default_arch() -> str:
    """GPU 0's architecture, or sm_120 without a GPU."""
    try:
        if device_count():
            return Device(0).arch
    except CudaError:
        pass
    return "sm_120"


def _archs(arch_opts) -> list[str]:
    """The architectures the ``--arch`` values name (:func:`check_arch_list`: each comma separated,
    the option repeatable, or ``all``), GPU 0's without any, or raise click.BadParameter."""
    if not arch_opts:
        try:
            return [check_arch(_default_arch())]
        except ValueError as exc:
            raise click.BadParameter(f"{exc} (GPU 0's; pass --arch to choose)", param_hint="--arch") from None
    try:
        return check_arch_list(arch_opts)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--arch") from None


def _resource_rows(where: str, arch: str, cub, dynamic: dict, problems: list) -> list:
    """Table rows of one cubin; appends a line to ``problems`` for each spill or shared-memory overflow."""
    limit = MAX_SHARED_PER_BLOCK[arch]
    rows = []
    for kname in sorted(cub.resources):
        r = cub.resources[kname]
        dyn = dynamic.get(kname)
        smem = r.shared_bytes + (dyn or 0)
        flags = []
        if r.spills:
            flags.append("SPILLS")
            problems.append(f"{where}:{kname} ({arch}) spills {r.spill_store_bytes} B stored and "
                            f"{r.spill_load_bytes} B loaded per thread")
        if smem > limit:
            flags.append("SMEM>LIMIT")
            problems.append(f"{where}:{kname} ({arch}) needs {smem:,} B of shared memory per block, "
                            f"over the {limit:,} B limit")
        rows.append((where, kname, cub.arch, r.registers, f"{r.shared_bytes:,}", "-" if dyn is None else f"{dyn:,}",
                     f"{limit:,}", f"{limit - smem:,}", r.stack_bytes, r.spills,
                     "hit" if cub.cache_hit else "compiled", " ".join(flags)))
    return rows


@main.command("compile", short_help="Compile every kernel with NVRTC; registers, shared memory, spills.")
@click.option("--arch", "arch_opt", multiple=True, metavar="sm_XX[,sm_YY]|all",
              help=f"Target architecture(s), comma separated or repeated: {', '.join(MAX_SHARED_PER_BLOCK)}; "
                   f"or 'all' for {', '.join(SUPPORTED_ARCHS)}. Suffixed targets (sm_90a, sm_100f) are refused: "
                   f"name the plain one; driverlevel picks each kernel's target (sm_90a for sm_90's wgmma verify-attention tile). "
                   f"Default: GPU 0's, or sm_120 without a GPU.")
@click.option("--kernel", "kernels", multiple=True, metavar="FILE[,FILE]",
              help="Kernel source in cu/ to compile, by name (argmax.cu), or by path (cu/argmax.cu) from a checkout "
                   "installed with `pip install -e .`; comma separated or repeated. "
                   "Default: every .cu file.")
def compile_cmd(arch_opt, kernels):
    """Compile every kernel source in cu/ with NVRTC and print a resource table.

    Each file is compiled in every variant its launcher module declares
    (its compile_variants()), with the defines the runtime uses. Columns per kernel:
    registers per thread; static shared memory per block (from ptxas) and dynamic
    (the most the launcher asks for, "-" for none), in bytes; the architecture's
    per-block limit (opt-in) and the headroom left under it; stack frame; spill bytes
    (stores + loads); and whether the cubin came from the cache. Needs no GPU.
    Exits 1 if NVRTC cannot be loaded, or any kernel fails to compile, spills, or needs more shared memory
    than the architecture allows per block; 2 for an unsupported --arch, an
    unrecognised DRIVERLEVEL_CACHE or DRIVERLEVEL_LINEINFO value or output that cannot be written.

    The table goes to stdout; a progress bar on a terminal (elsewhere, a log or a pipe,
    one line per file variant NVRTC compiled, cache hits left out), NVRTC's warnings (after
    the table), the problems and a one-line warning when the cubin cache cannot be
    written go to stderr.
    """
    archs = _archs(arch_opt)
    available = kernel_sources()
    # a path to one of cu/'s files (cu/argmax.cu from the checkout's root, as a shell completes it) is that file
    src = kernel_source_dir().resolve()
    kernels = [k.strip() for value in kernels for k in value.split(",")]  # argmax.cu,runner.cu as --arch takes
    if any(not k for k in kernels):  # --kernel "" (an empty $K in a script) must not compile all of cu/
        raise click.BadParameter("an empty kernel name (a file of cu/, e.g. argmax.cu; leave --kernel out to "
                                 "compile every file)", param_hint="--kernel")
    names = [Path(k).name if Path(k).name in available and Path(k).resolve() == src / Path(k).name else k
             for k in kernels]
    files = list(dict.fromkeys(names)) or available  # a repeated --kernel is compiled and listed once, as --arch
    for f in files:
        if f not in available:
            if Path(f).name in available and Path(f).is_file():
                # a checkout's cu/argmax.cu after a plain `pip install .`: not the file compiled
                raise click.BadParameter(
                    f"{f} is not in the kernel source directory this driverlevel compiles ({src}); to compile "
                    f"a checkout's cu/, install it with `pip install -e .` or run with PYTHONPATH set to it",
                    param_hint="--kernel")
            if Path(f).name in available:  # cu/argmax.cu from a directory where that path does not exist
                raise click.BadParameter(f"no file {f!r} here (in {Path.cwd()}); a kernel source of cu/ is "
                                         f"named by its file name: --kernel {Path(f).name}", param_hint="--kernel")
            hint = f"; did you mean --kernel {f}.cu?" if f"{f}.cu" in available else ""
            raise click.BadParameter(f"no kernel source {f!r} in cu/ (have: {', '.join(available)}){hint}",
                                     param_hint="--kernel")
    try:
        check_compile_env()  # an unrecognised DRIVERLEVEL_CACHE / _LINEINFO: one usage error, not one per compile
    except ValueError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    try:  # no NVRTC library to load (cuda.pathfinder's DynamicLibNotFoundError): one line, not a traceback
        nvrtc_version()
    except (RuntimeError, OSError) as exc:
        click.echo(f"Error: NVRTC is not usable here ({type(exc).__name__}: {exc}); `driverlevel info` says what "
                   f"it finds", err=True)
        sys.exit(1)
    with pywarnings.catch_warnings(record=True) as caught:
        pywarnings.simplefilter("always")
        failed = _compile_jobs(files, archs)
    # driverlevel's own warnings (e.g. an unwritable cubin cache) become one plain line each: as a
    # Python warning they would point into click's source; other warnings are shown as usual.
    said = set()
    for w in caught:
        text = str(w.message)
        if text.startswith("driverlevel: "):
            if text not in said:
                said.add(text)
                click.echo(f"warning: {text[len('driverlevel: '):]}", err=True)
        else:
            pywarnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if failed:
        sys.exit(1)


def _compile_jobs(files, archs) -> bool:
    """``driverlevel compile``'s work: compile every variant, print the table and the problems;
    True if there were problems."""
    rows, problems, warnings = [], [], {}
    jobs = []  # (file, arch, variant): known up front so the progress bar has a total
    for f in files:
        for arch in archs:
            try:
                variants = compile_variants(f, arch)
            except Exception as exc:  # a broken launcher must not hide the other files
                problems.append(f"{f} ({arch}): its compile variants could not be computed: {exc}")
                continue
            jobs.extend((f, arch, v) for v in variants)
    with _progress(len(jobs)) as bar:
        for i, (f, arch, v) in enumerate(jobs, 1):
            where = f"{f} [{v.label}]" if v.label else f
            bar.set_postfix_str(f"{where} {arch}", refresh=False)
            t0 = time.perf_counter()
            try:
                cub = compile_file(f, v.target or arch, v.defines)
            except (NvrtcError, ValueError) as exc:  # ValueError: a target the installed NVRTC lacks
                problems.append(f"{where} ({arch}) failed to compile:\n{exc}")
                continue
            finally:
                bar.update()
            if bar.disable and not cub.cache_hit:  # no bar (a log, a pipe): one line per NVRTC run
                click.echo(f"compiled {where} for {v.target or arch} in {time.perf_counter() - t0:.1f} s "
                           f"({i}/{len(jobs)})", err=True)
            rows.extend(_resource_rows(where, arch, cub, v.dynamic_shared, problems))
            text = _log_warnings(cub.log)
            if text:
                warnings.setdefault(text, []).append(f"{where} ({arch})")
    if rows:
        click.echo(_table(rows))
    for text, wheres in warnings.items():
        click.echo(f"NVRTC warnings compiling {', '.join(wheres)}:\n{text}", err=True)
    for p in problems:
        click.echo(p, err=True)
    hint = _old_nvrtc_hint(nvrtc_version(), "the kernels build without spills")
    if hint and any(" spills " in p for p in problems):
        click.echo(hint, err=True)
    return bool(problems)


def _stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def _progress(total: int):
    """A progress bar of ``total`` compiles on stderr, shown only when stderr is a terminal (so a
    redirected stderr gets no bar text); it is cleared when done, before the table goes to stdout."""
    from tqdm import tqdm

    return tqdm(total=total, desc="compile", unit="cubin", file=sys.stderr, leave=False,
                disable=not _stderr_is_tty(), dynamic_ncols=True)


_PTXAS_REPORT = re.compile(r"^ptxas(\s+info\s*:|\s+\.)")


def _log_warnings(log: str) -> str:
    """The warnings of an NVRTC log (front end and ptxas), or "" if it has none: the log without
    ptxas's resource report (``ptxas info`` lines, which ``-Xptxas -v`` always adds), when a line
    of what is left says ``warning``."""
    kept = [line for line in (log or "").splitlines() if not _PTXAS_REPORT.match(line)]
    if not any(re.search(r"\bwarning\b", line, re.IGNORECASE) for line in kept):
        return ""
    return "\n".join(kept).strip()


# -- bench -------------------------------------------------------------------------------
@main.group(short_help="Benchmarks (need a GPU).")
def bench():
    """Benchmarks (need a GPU): medians and ratios measured side by side in one run."""


@bench.command("replay", cls=json_usage_errors("json_path"),
               short_help="Host µs per graph replay: ours, raw cuGraphLaunch, torch.")
@click.option("--nodes", default="1,10,50", show_default=True, help=f"Comma-separated kernel counts per graph "
              f"(1 to {MAX_NODES:,} each).")
@click.option("--replays", default=10_000, show_default=True, type=click.IntRange(MIN_REPLAYS, MAX_REPLAYS),
              help=f"Replays (and eager steps) per variant and repetition, {MIN_REPLAYS} to {MAX_REPLAYS:,}.")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1, MAX_REPEATS),
              help=f"Repetitions, 1 to {MAX_REPEATS}; medians are reported.")
@click.option("--device", "ordinal", default=0, show_default=True, type=click.IntRange(0), help="GPU ordinal.")
@click.option("--no-torch", is_flag=True, help="Skip the torch.cuda.CUDAGraph peer even if torch is installed.")
@click.option("--json", "json_path", default=None, metavar="PATH", help="Also write the results as JSON ('-' for stdout, the table then goes to stderr).")
def bench_replay(nodes, replays, repeats, ordinal, no_torch, json_path):
    """Host µs per graph replay of 1/10/50 trivial kernels: ours vs raw cuGraphLaunch vs torch, and eager launches.

    Without a GPU: one sentence on stderr and exit 2 (with --json -, also {"error": ..., "exit_status": 2}
    on stdout, as capture-demo --json). Bad options, a --json path that cannot be written and a
    --device past the visible GPUs exit 2 before anything is measured.
    """
    from . import bench_replay as br

    try:
        counts = br.parse_node_counts(nodes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodes") from None
    problem = json_path_problem(json_path)
    if problem:
        raise click.BadParameter(problem, param_hint="--json")
    sys.exit(br.main_from_options(counts, replays, repeats, ordinal, not no_torch, json_path))


main.add_command(capture_demo)


if __name__ == "__main__":
    main()
