"""PTX of a kernel source as NVRTC makes it with the runtime's options (CPU tests; no GPU)."""

from __future__ import annotations


def ptx_of(source: str, name: str, arch: str, defines: dict | None = None) -> str:
    """The PTX NVRTC makes of ``source`` for ``compute_XX`` of ``arch``, with the runtime's options."""
    from cuda.bindings import nvrtc

    from driverlevel._compile import _include_dirs, _options, _program_path
    from driverlevel._errors import check_nvrtc

    opts = [f"--gpu-architecture=compute_{arch[3:]}" if o.startswith("--gpu-architecture=") else o
            for o in _options(arch, defines or {}, ()) if o != "-Xptxas=-v"]
    local = _include_dirs(())
    opts += [f"-I{d}" for d in local]
    # named as the runtime names it (a file of cu/), so that the current directory is never searched
    path = _program_path(local[0], name)
    prog = check_nvrtc("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(source.encode(), path.encode(), 0, [], []))
    try:
        check_nvrtc("nvrtcCompileProgram", nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts]),
                    prog, opts, arch, name)
        size = check_nvrtc("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog), prog)
        buf = b" " * size
        check_nvrtc("nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, buf), prog)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return buf.rstrip(b"\x00").decode()


def ptx_entries(ptx: str) -> dict:
    """PTX text per entry point."""
    return {e.split("(", 1)[0]: e for e in ptx.split(".visible .entry ")[1:]}
