"""NVRTC compilation of the kernels in ``cu/`` to cubin, with an on-disk cache.

Kernels are compiled for one exact architecture (``sm_80`` … ``sm_120``) to cubin
(SASS); PTX is never handed to the driver, so a newer NVRTC works with an older
13.x driver. The ptxas resource report (registers, shared memory, stack, spills)
is parsed from the compile log and kept with the cubin.

Cache
-----
Entries live in ``$DRIVERLEVEL_CACHE_DIR`` (``~`` expanded, a relative path made absolute
once; default ``$XDG_CACHE_HOME/driverlevel`` or ``~/.cache/driverlevel``); ``DRIVERLEVEL_CACHE=0``
(or ``off``, ``false``, ``no``) disables the disk cache, ``1``/``on``/``true``/``yes`` or unset
keeps it, and any other value is a ``ValueError`` (:func:`cache_dir`). ``DRIVERLEVEL_LINEINFO=1``
compiles with ``-lineinfo`` (:func:`lineinfo_requested`), a key of its own.
The key hashes the source, every local header it includes (``#include "..."`` or ``<...>`` found in
the caller's ``include_dirs`` or ``cu/``, recursively; a header's own ``"..."`` includes are
looked up in its folder first, as NVRTC does; comments are removed before the directives are read;
the current directory is never searched; where any ``#include`` names its header through a macro,
``#include HDR``, or asks ``__has_include``, every regular file under those directories,
recursively), the CUDA headers (``cuda_bf16.h`` and friends) found on the include path, the
paths of the program and of the local include directories (NVRTC writes them into the cubin:
``__FILE__``, ``-lineinfo``), the options and defines, the architecture, the NVRTC version and
the package version. Writes are atomic (temporary file + rename); an entry whose checksum or
length does not match is recompiled and rewritten, never loaded. Entries and directories are created as any
file is (mode ``0o666`` / ``0o777`` less the umask), so that a cache shared by several users
(a group-writable directory, umask 002) serves them all. Loading an entry sets its modification
time to now where the entry is writable (in a read-only cache it stays as it was: a cache others
own is still used), so an entry's modification time says when it was last compiled or loaded:
``find DIR -name '*.cubin' -mtime +30 -delete`` prunes what has not been used for a month, and
``tools/kernel_cache.py export --since`` takes the entries one run used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
import os
import re
import struct
import sys
import threading
from collections.abc import Mapping, Set as AbstractSet
from dataclasses import dataclass, field, replace
from pathlib import Path

from cuda.bindings import nvrtc

from ._checks import bool_arg, is_bool
from ._errors import NvrtcError, PicklableError, check_nvrtc

__all__ = [
    "CompileVariant",
    "Cubin",
    "KernelResources",
    "SUPPORTED_ARCHS",
    "MAX_SHARED_PER_BLOCK",
    "compile_file",
    "compile_source",
    "kernel_source_dir",
    "kernel_sources",
    "nvrtc_version",
    "normalize_arch",
    "check_arch",
    "cache_dir",
    "lineinfo_requested",
]

#: The architectures every kernel is built and checked for: ``driverlevel compile --arch all`` and
#: the CPU tests (no spills, shared memory within the limit). :func:`check_arch` also takes the
#: other keys of :data:`MAX_SHARED_PER_BLOCK` (sm_87, sm_103, sm_121), which share these families'
#: kernels; the runtime (:func:`normalize_arch`) takes whatever GPU it finds, newer ones too.
SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")

#: Opt-in shared memory per block, bytes, by architecture (CUDA C Programming Guide,
#: "Technical Specifications per Compute Capability").
MAX_SHARED_PER_BLOCK = {
    "sm_80": 166_912,
    "sm_86": 101_376,
    "sm_87": 166_912,
    "sm_89": 101_376,
    "sm_90": 232_448,
    "sm_100": 232_448,
    "sm_103": 232_448,
    "sm_120": 101_376,
    "sm_121": 101_376,
}

_MAGIC = b"DLCUBIN1"
_PACKAGE_VERSION = "0.1.0"
#: Part of every cache key: bumped when what a key covers, or how NVRTC is called, changes, so that
#: entries written under the old rules are never served. 2: NVRTC no longer searches the current
#: directory (a common.cuh there replaced cu/'s, and that cubin was stored under cu/'s key).
_KEY_FORMAT = "2"
_mem_cache: dict[str, "Cubin"] = {}
_mem_lock = threading.Lock()


@dataclass(frozen=True)
class KernelResources:
    """ptxas's resource report for one kernel.

    Attributes
    ----------
    registers : int
        Registers per thread.
    shared_bytes : int
        Static shared memory per block, bytes (dynamic shared memory is the launcher's).
    stack_bytes : int
        Stack frame per thread, bytes.
    spill_store_bytes, spill_load_bytes : int
        Register spill traffic, bytes per thread (0 for a healthy kernel).
    """

    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def spills(self) -> int:
        """Spill bytes per thread, stores + loads (0 for a kernel that does not spill)."""
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class CompileVariant:
    """One way a launcher compiles its kernel file, with the most dynamic shared memory it
    launches each kernel of that cubin with.

    A launcher module (``verify_attention.py`` for ``cu/verify_attention.cu``, …) declares
    every variant it can compile on an architecture in a module-level
    ``compile_variants(arch) -> list[CompileVariant]``; ``driverlevel compile`` compiles
    each and checks its shared memory against the architecture's per-block limit.

    Attributes
    ----------
    defines : dict of str to int
        The NVRTC ``-D`` defines, exactly as the launcher passes them to :func:`compile_file`
        (so the command line and the runtime share a cache entry).
    dynamic_shared : dict of str to int
        ``{kernel name: bytes}``: the largest dynamic shared memory per block any launch of
        that kernel asks for on this architecture; kernels launched without any are absent.
    label : str
        Names the variant when a file has several (e.g. ``"rows=64 csplit=2 keys=32"``);
        ``""`` for a file's only variant.
    target : str
        The NVRTC target when it is not the architecture the variants are listed for (``"sm_90a"``
        for a tile that uses wgmma on sm_90); ``""`` otherwise. Compile with
        ``compile_file(file, v.target or arch, v.defines)``.

    Example
    -------
    >>> CompileVariant({"DL_STAGES": 3}, {"mla_gemm": 61_440})       # doctest: +SKIP
    """

    defines: dict
    dynamic_shared: dict = field(default_factory=dict)
    label: str = ""
    target: str = ""


@dataclass
class Cubin:
    """A compiled cubin and what is known about it.

    Attributes
    ----------
    data : bytes
        The cubin (ELF with SASS for :attr:`arch`).
    arch : str
    source_name : str
    options : tuple of str
    resources : dict of str to KernelResources
        Per kernel (entry) name.
    log : str
        NVRTC's log of the compile that produced it.
    cache_hit : bool
        True if read from the disk (or in-process) cache instead of compiled.
    key : str
        The cache key (hex sha256).
    """

    data: bytes = field(repr=False)
    arch: str
    source_name: str
    options: tuple = field(repr=False)
    resources: dict = field(default_factory=dict, repr=False)
    log: str = field(default="", repr=False)
    cache_hit: bool = False
    key: str = ""

    def __repr__(self):
        return (f"<Cubin {self.source_name} {self.arch}: {len(self.data):,} B, kernels {sorted(self.resources)}, "
                f"{'cache hit' if self.cache_hit else 'compiled'}, key {self.key[:12]}>")


def kernel_source_dir() -> Path:
    """Directory holding the kernel sources (``cu/``), in a wheel or a checkout.

    Raises
    ------
    FileNotFoundError
        If the sources cannot be found (a broken install).
    """
    here = Path(__file__).resolve().parent
    # A wheel installs them as driverlevel/cu/; a checkout (plain or editable) has them in cu/.
    for p in (here / "cu", here.parent / "cu"):
        if (p / "common.cuh").is_file():
            return p
    try:  # any other loader that maps the driverlevel.cu package somewhere else
        from importlib.resources import files

        p = Path(str(files("driverlevel.cu").joinpath("common.cuh"))).parent
        if (p / "common.cuh").is_file():
            return p
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    raise FileNotFoundError("driverlevel's kernel sources (cu/*.cu) were not found next to the package")


def kernel_sources() -> list[str]:
    """File names of every kernel source (``*.cu``) shipped with the package."""
    return sorted(p.name for p in kernel_source_dir().glob("*.cu"))


def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the NVRTC library in use."""
    major, minor = check_nvrtc("nvrtcVersion", nvrtc.nvrtcVersion())
    return int(major), int(minor)


def normalize_arch(arch) -> str:
    """``"sm_90"`` from ``"sm_90"``, ``"90"``, ``90``, ``(9, 0)`` or a Device; ``"sm_90a"``
    (an architecture-specific target) is kept as it is.

    Lenient on purpose: the runtime applies it to whatever GPU it finds, so any real
    target of sm_80 or newer passes, including ones newer than :data:`SUPPORTED_ARCHS`
    (:func:`check_arch` is the strict check of a name typed on a command line;
    :func:`compile_source` also checks the target against the NVRTC in use).

    Raises
    ------
    TypeError
        For a bool, None, a float or anything else that is not a str, an int, a tuple or an
        object with an ``arch`` attribute (a Device).
    ValueError
        For a malformed architecture (a tuple other than ``(major, minor)`` of ints with
        ``major >= 1`` and ``minor`` 0 to 9, a number with a leading zero such as ``"sm_090"``,
        a virtual ``compute_XX``, a family target such as ``sm_100f``) or one older than sm_80.
    """
    if hasattr(arch, "arch") and not isinstance(arch, str):
        arch = arch.arch
    if isinstance(arch, bool) or not isinstance(arch, (str, numbers.Integral, tuple)):
        raise TypeError(f"arch must be a str such as 'sm_90', an int, a (major, minor) tuple or a Device, "
                        f"got {type(arch).__name__} {arch!r}")
    given = arch
    if isinstance(arch, tuple):
        major, minor = arch if len(arch) == 2 else (None, None)
        if not (_is_int(major) and _is_int(minor) and major >= 1 and 0 <= minor <= 9):
            raise ValueError(f"unsupported architecture {given!r}: a compute capability tuple is (major, minor), "
                             f"two ints with major >= 1 and minor 0 to 9, e.g. (9, 0)")
        arch = f"sm_{int(major)}{int(minor)}"
    s = _arch_text(arch)
    m = re.fullmatch(r"sm_([0-9]+)a?", s)  # (ASCII digits: str.isdigit and \d take "１２０" too)
    if m and len(m.group(1)) > 1 and m.group(1).startswith("0") and m.group(1).lstrip("0"):
        # (an all-zero number, sm_00, is no leading-zero typo of a real one: "older than sm_80" below)
        plain = "sm_" + s[3:].lstrip("0")
        raise ValueError(f"unsupported architecture {given!r}: the number has a leading zero (write {plain!r})")
    if not m or int(m.group(1)) < 80:
        raise ValueError(f"unsupported architecture {given!r}: expected a real target sm_XX of sm_80 or newer, "
                         f"optionally architecture-specific (sm_90a); not a virtual compute_XX or a family target "
                         f"(sm_100f). Those whose limits driverlevel knows: {', '.join(MAX_SHARED_PER_BLOCK)}")
    return s


def _is_int(v) -> bool:
    """``v`` is an integer (numpy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _arch_text(name) -> str:
    """An architecture given as text, in the one spelling every check compares: blanks stripped, lower
    case (``"SM_90"``, ``"Sm_120a"`` and ``"sm_90A"`` are ``"sm_90"``, ``"sm_120a"``, ``"sm_90a"``), and a bare
    number prefixed (``"90"`` is ``"sm_90"``). Checks nothing else: :func:`normalize_arch`, :func:`check_arch`
    and :func:`check_cubin_arch` decide what they accept."""
    s = str(name).strip().lower()
    return "sm_" + s if s.isascii() and s.isdigit() else s


_REAL_TARGET_RE = re.compile(r"sm_([0-9]+)([af]?)")


def check_cubin_arch(cubin_arch, device_arch) -> None:
    """Raise ``ValueError`` unless a cubin compiled for ``cubin_arch`` runs on a GPU of ``device_arch``
    (:func:`~driverlevel.load_module`'s check, made before the driver is asked).

    * a plain target (``"sm_90"``) loads on exactly that compute capability (driverlevel's rule: its
      kernels and their shared-memory limit, ``DL_SMEM_LIMIT``, are built for one architecture);
    * an architecture-specific target (``"sm_90a"``: the ``wgmma`` / ``setmaxnreg`` feature set) runs
      on exactly the compute capability of its base (``sm_90a`` on 9.0, nowhere else);
    * a family-specific target (``"sm_100f"``) runs on the GPUs of its family of a minor version at
      least its own: the same major compute capability (``sm_100f`` on 10.0 and 10.3, ``sm_120f`` on
      12.0 and 12.1; ``sm_103f`` on 10.3 only).

    Both names are compared in lower case (:func:`_arch_text`). ``device_arch`` is a GPU's plain
    architecture (``Device.arch``).

    Raises
    ------
    ValueError
        Naming both architectures and why the cubin does not run there; or for a ``cubin_arch`` /
        ``device_arch`` that is no real target ``sm_XX`` (optionally with ``a`` / ``f`` for the cubin).
    """
    c, d = _arch_text(cubin_arch), _arch_text(device_arch)
    mc, md = _REAL_TARGET_RE.fullmatch(c), _REAL_TARGET_RE.fullmatch(d)
    if mc is None:
        raise ValueError(f"the cubin's architecture {cubin_arch!r} is no real target (sm_XX, sm_XXa or sm_XXf)")
    if md is None or md.group(2):
        raise ValueError(f"the device's architecture {device_arch!r} is no plain real target (sm_XX)")
    cnum, dnum, suffix = int(mc.group(1)), int(md.group(1)), mc.group(2)

    def cc(n: int) -> str:
        return f"compute capability {n // 10}.{n % 10}"

    if suffix == "f":
        if cnum // 10 == dnum // 10 and dnum >= cnum:
            return
        raise ValueError(f"cubin was compiled for {c}, a family-specific target that runs on compute capability "
                         f"{cnum // 10}.x with x >= {cnum % 10}, but the device is {d} ({cc(dnum)}): compile for {d}")
    if cnum == dnum:
        return
    if suffix == "a":
        raise ValueError(f"cubin was compiled for {c}, an architecture-specific target that runs only on "
                         f"{cc(cnum)}, but the device is {d} ({cc(dnum)}): compile for {d}")
    raise ValueError(f"cubin was compiled for {c} but the device is {d}: compile for {d} (a cubin is loaded only "
                     f"on the architecture it was compiled for)")


@functools.lru_cache(maxsize=None)
def _nvrtc_supported_archs() -> tuple[str, ...]:
    """The real targets the NVRTC in use compiles for, e.g. ``("sm_75", "sm_80", ...)``
    (``nvrtcGetSupportedArchs``)."""
    archs = check_nvrtc("nvrtcGetSupportedArchs", nvrtc.nvrtcGetSupportedArchs())
    return tuple(f"sm_{int(a)}" for a in archs)


class UnsupportedTargetError(PicklableError, ValueError):
    """The NVRTC in use cannot compile for the requested architecture (a ``ValueError``: what
    :func:`compile_source` documents). A separate class so that callers can tell it from bad
    arguments: on the GPU's own architecture it is the environment's problem, not the user's."""


def _check_nvrtc_supports(arch: str) -> None:
    """UnsupportedTargetError (a ValueError), naming the supported targets, when the NVRTC in use
    cannot compile for ``arch`` (NVRTC itself would answer NVRTC_ERROR_INVALID_OPTION)."""
    supported = _nvrtc_supported_archs()
    base = arch.rstrip("a")
    if base not in supported or (arch != base and int(base[3:]) < 90):  # 'a' targets start at sm_90a
        major, minor = nvrtc_version()
        usable = [a for a in supported if int(a[3:]) >= 80]
        raise UnsupportedTargetError(f"unsupported architecture {arch!r}: NVRTC {major}.{minor} compiles for "
                         f"{', '.join(usable)} (sm_80 or newer; architecture-specific 'a' targets from "
                         f"sm_90a on, where the base is listed)")


def arch_number(arch) -> int:
    """The compute capability of ``arch`` as one number: 90 for ``"sm_90"`` and ``"sm_90a"``
    (any form :func:`normalize_arch` takes).

    Raises
    ------
    ValueError
        As :func:`normalize_arch`.
    """
    return int(normalize_arch(arch)[3:].rstrip("a"))


def shared_limit(arch) -> int:
    """Shared memory one block may use on ``arch``, bytes (the opt-in limit).

    An architecture-specific target (``sm_90a``) has its base's limit. An architecture
    newer than the table gets 101,376 B, the smallest limit of the supported ones
    (sm_86/89/120), so every kernel still fits.
    """
    s = normalize_arch(arch)
    return MAX_SHARED_PER_BLOCK.get(s.rstrip("a"), 101_376)


def check_arch(name) -> str:
    """A target architecture named on a command line, checked strictly: ``"sm_90"`` from
    ``"sm_90"``, ``"SM_90"`` or ``"90"``.

    Unlike :func:`normalize_arch` (which the runtime applies to whatever GPU it finds),
    only architectures whose per-block shared-memory limit is known
    (:data:`MAX_SHARED_PER_BLOCK`) are accepted, so no limit is ever a default.

    Raises
    ------
    ValueError
        Naming what was wrong and listing the accepted names: a name that is no
        architecture (or has a leading zero, ``sm_090``), a virtual one (``compute_90``), one
        older than sm_80, one unknown to driverlevel (``sm_999``), or a suffixed one
        (``sm_90a``, ``sm_100f``): a user names the GPU's plain architecture and driverlevel
        picks each kernel's target itself (the plain one, or ``sm_90a`` for sm_90's wgmma
        verify-attention tile: ``CompileVariant.target``), which the runtime loads on that GPU.
    TypeError
        ``name`` is neither a str nor an int (numpy's too; ``None``, bytes, a bool...), as
        :func:`normalize_arch` says for the same values.
    """
    if isinstance(name, bool) or not isinstance(name, (str, numbers.Integral)):
        raise TypeError(f"an architecture name must be a str such as 'sm_90' (or an int such as 90), "
                        f"got {type(name).__name__} {name!r}")
    if not isinstance(name, str):
        name = int(name)  # (a numpy integer: str(np.int64(90)) is "90" anyway)
    known = ", ".join(MAX_SHARED_PER_BLOCK)
    text = str(name).strip()
    s = _arch_text(text)
    m = re.fullmatch(r"(sm|compute)_([0-9]+)([af]?)", s)
    if m is None:
        why = f"{text!r} is not an architecture name"
    elif len(m.group(2)) > 1 and m.group(2).startswith("0") and m.group(2).lstrip("0"):  # (sm_00: older than sm_80)
        why = f"{text!r} has a leading zero in its number (write {m.group(1)}_{m.group(2).lstrip('0')}{m.group(3)})"
    elif m.group(1) == "compute":
        why = f"{text!r} is a virtual architecture (PTX); driverlevel compiles cubin for a real one"
    elif m.group(3):
        plain = f"sm_{m.group(2)}"
        why = (f"{text!r} is {'an architecture' if m.group(3) == 'a' else 'a family'}-specific target; driverlevel "
               f"picks each kernel's target for the GPU's plain architecture (the plain one, or sm_90a for sm_90's "
               f"wgmma verify-attention tile): use {plain}")
    elif int(m.group(2)) < 80:
        why = f"{text!r} is older than sm_80 (the kernels need cp.async and bf16 tensor cores)"
    elif s not in MAX_SHARED_PER_BLOCK:
        why = f"{text!r} is not an architecture driverlevel knows (its shared-memory limit per block is unknown)"
    else:
        return s
    raise ValueError(f"unsupported architecture: {why}. Supported: {known}")


def check_arch_list(values, option: str = "--arch") -> list[str]:
    """The architectures that ``--arch`` values name, as ``driverlevel compile`` and the tools in
    ``tools/`` take them: each value one name or names separated by single commas (``sm_90,sm_120``;
    the option may repeat), or ``all`` (any case) alone for every one of :data:`SUPPORTED_ARCHS`.
    Each name is checked by :func:`check_arch`; a name given twice is listed once. ``option`` names
    the option in the messages.

    Raises
    ------
    ValueError
        An empty name (``sm_90,,sm_120``, a trailing comma), ``all`` beside other names, or what
        :func:`check_arch` refuses.
    """
    names = []
    for value in values:
        parts = str(value).split(",")
        if any(not a.strip() for a in parts):
            raise ValueError(f"empty architecture name in {value!r}: give names separated by single commas, "
                             f"e.g. sm_90,sm_120, or 'all'")
        names += parts
    alls = [a.strip().lower() == "all" for a in names]
    if alls and all(alls):
        return list(SUPPORTED_ARCHS)
    if any(alls):
        given = " ".join(f"{option} {v}" for v in values)
        raise ValueError(f"'all' stands alone (it names every supported architecture), got {given!r}")
    return list(dict.fromkeys(check_arch(a) for a in names))


#: Values of a driverlevel on/off environment variable (lower case, surrounding blanks ignored).
_FLAG_OFF = ("0", "off", "false", "no")
_FLAG_ON = ("1", "on", "true", "yes")


def _env_flag(name: str, default: bool, usage: str) -> bool:
    """The on/off environment variable ``name``: unset or empty is ``default``; ``ValueError`` naming
    the value and ``usage`` for anything but :data:`_FLAG_OFF` / :data:`_FLAG_ON` (any case)."""
    value = os.environ.get(name)
    v = (value or "").strip().lower()
    if not v:
        return default
    if v in _FLAG_OFF:
        return False
    if v in _FLAG_ON:
        return True
    raise ValueError(f"{name}={value!r} is not understood: {usage}")


def lineinfo_requested() -> bool:
    """Whether ``DRIVERLEVEL_LINEINFO`` asks NVRTC for ``-lineinfo`` (source lines in the cubin, for
    ``compute-sanitizer`` reports and Nsight Compute's source view; the SASS is unchanged).

    Unset, empty, ``0``, ``off``, ``false`` or ``no``: no; ``1``, ``on``, ``true`` or ``yes``: yes
    (any case). The option is part of the cache key, so both builds are cached side by side.

    Raises
    ------
    ValueError
        For any other value (a typo must not silently mean either).
    """
    return _env_flag("DRIVERLEVEL_LINEINFO", False, "use 1, on, true or yes to compile with -lineinfo, or 0, off, "
                                                    "false or no (or leave it unset) to compile without")


def cache_dir() -> Path | None:
    """The disk cache directory, or None when ``DRIVERLEVEL_CACHE=0`` disables it.

    ``DRIVERLEVEL_CACHE`` is ``0``, ``off``, ``false`` or ``no`` (any case) to disable the
    disk cache; unset, empty, ``1``, ``on``, ``true`` or ``yes`` keep it.

    ``DRIVERLEVEL_CACHE_DIR`` names the directory: a leading ``~`` is expanded, and a relative
    path is made absolute against the current directory of the first call that sees the value
    (the process's directory changing later does not move the cache). Unset, empty or blank:
    ``$XDG_CACHE_HOME/driverlevel`` when ``XDG_CACHE_HOME`` is an absolute path (a relative one is
    ignored, as the XDG Base Directory specification says), else ``~/.cache/driverlevel``.
    Nothing is evicted: delete the directory to reclaim its space (entries are rebuilt on demand).

    Raises
    ------
    ValueError
        For any other ``DRIVERLEVEL_CACHE`` value (e.g. ``maybe``): a typo must not silently
        mean "on".
    """
    if not _env_flag("DRIVERLEVEL_CACHE", True, "use 0, off, false or no to disable the disk cache, or 1, on, "
                                                 "true or yes (or leave it unset) to keep it"):
        return None
    d = os.environ.get("DRIVERLEVEL_CACHE_DIR")
    if d and d.strip():  # (blank: an unset shell variable quoted with spaces, not a directory named "   ")
        return _absolute_cache_dir(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "driverlevel"


def check_compile_env() -> None:
    """Check the compile's environment variables before anything is compiled: ``DRIVERLEVEL_CACHE``
    (:func:`cache_dir`) and ``DRIVERLEVEL_LINEINFO`` (:func:`lineinfo_requested`). ``driverlevel
    compile`` and the tools in ``tools/`` call it after their options, so that a typo is one usage
    error, not a traceback from the first compile.

    Raises
    ------
    ValueError
        Naming the variable, its value and the values it takes.
    """
    cache_dir()
    lineinfo_requested()


def check_compile_options(arch_values, option: str = "--arch") -> list[str]:
    """What a script of ``tools/`` that compiles checks before its first compile: the architectures
    of its ``--arch`` values (:func:`check_arch_list`), then :func:`check_compile_env`. Returns the
    architectures.

    Raises
    ------
    ValueError
        From :func:`check_arch_list`, its message prefixed with ``option`` (``--arch: ...``), or from
        :func:`check_compile_env`, as it is: a script reports either as its usage error.
    """
    try:
        archs = check_arch_list(arch_values, option)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    check_compile_env()
    return archs


#: ``DRIVERLEVEL_CACHE_DIR`` values -> the absolute directory each was first taken to mean.
_absolute_cache_dirs: dict[str, Path] = {}


def _absolute_cache_dir(value: str) -> Path:
    """``DRIVERLEVEL_CACHE_DIR``'s ``value`` with ``~`` / ``~user`` expanded and made absolute against the
    current directory of the first call that sees it: a later ``os.chdir`` does not move the cache."""
    with _mem_lock:
        p = _absolute_cache_dirs.get(value)
        if p is None:
            p = _absolute_cache_dirs[value] = Path(os.path.abspath(os.path.expanduser(value)))
    return p


def _cache_write_failure(cdir: Path, exc: OSError) -> str:
    """Why the cache in ``cdir`` could not be written, in words: a path component that is a file
    (mkdir's misleading "File exists" / "Not a directory"), else the OS's reason."""
    where = f"DRIVERLEVEL_CACHE_DIR={cdir}" if os.environ.get("DRIVERLEVEL_CACHE_DIR", "").strip() else str(cdir)
    why = exc.strerror or str(exc)
    for p in (cdir, *cdir.parents):  # (os.path's tests, not Path's: on Python < 3.14 those raise on
        if os.path.exists(p):            # a directory that cannot be searched or a name too long)
            if not os.path.isdir(p):
                why = f"{p} is not a directory" if p != cdir else "it is not a directory"
            break
    return (f"driverlevel: could not write the cubin cache in {where}: {why}; compiling without the disk cache "
            f"(set DRIVERLEVEL_CACHE_DIR to a writable directory, or DRIVERLEVEL_CACHE=0)")


def _cache_read_failure(entry: Path, exc: OSError) -> str:
    """Why the cache entry ``entry`` could not be read, in words (the entry is there: a miss is no failure)."""
    why = exc.strerror or str(exc)
    if os.path.isdir(entry):  # (os.path's: Path.is_dir raises on Python < 3.14 where the directory cannot be searched)
        why = "it is a directory"
    return (f"driverlevel: could not read the cubin cache entry {entry}: {why}; compiling the kernel again "
            f"(make the entry readable or remove it, set DRIVERLEVEL_CACHE_DIR to a cache of your own, or "
            f"DRIVERLEVEL_CACHE=0)")


def include_dirs(extra=()) -> list[str]:
    """Include directories: ``extra`` (searched first), ``cu/``, then the CUDA runtime headers
    (found with cuda.pathfinder)."""
    dirs = [str(Path(d)) for d in extra] + [str(kernel_source_dir())]
    cuda_inc = None
    try:
        import cuda.pathfinder as pf

        cuda_inc = pf.find_nvidia_header_directory("cudart")
    except Exception:
        cuda_inc = None
    if not cuda_inc:
        for env in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(env) and os.path.isfile(os.path.join(os.environ[env], "include", "cuda_bf16.h")):
                cuda_inc = os.path.join(os.environ[env], "include")
                break
    if cuda_inc:
        dirs.append(str(cuda_inc))
    return dirs


_include_dirs = include_dirs


def _clear_memory_cache() -> None:
    """Forget the in-process cubin cache (as a new process would); the disk cache stays."""
    with _mem_lock:
        _mem_cache.clear()


# The CUDA headers the kernels include with <...>: their contents are part of the cache key,
# so that upgrading the header wheel (without NVRTC) recompiles.
_SYSTEM_HEADERS = ("cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp16.h", "cuda_fp16.hpp")


@functools.lru_cache(maxsize=8)
def _system_headers_digest(dirs: tuple) -> str:
    """sha256 over the contents of :data:`_SYSTEM_HEADERS` found in ``dirs``."""
    h = hashlib.sha256()
    for d in dirs:
        for name in _SYSTEM_HEADERS:
            p = Path(d) / name
            if p.is_file():
                h.update(name.encode() + b"\0" + p.read_bytes() + b"\0\1")
    return h.hexdigest()


#: What :func:`_strip_comments` reads as one unit: a comment (replaced by a space), or a string or
#: character literal or a number with digit separators (kept: a ``//`` or ``/*`` in them starts no
#: comment, and ``1'000`` starts no character literal).
_LEXEME_RE = re.compile(r"""//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|\.?\b\d(?:'\w|[\w.])*""",
                        re.DOTALL)
#: An ``#include`` directive of comment-free text (``#`` or its digraph ``%:``): its operand, up to
#: the end of the line.
_INCLUDE_RE = re.compile(r"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*include\b[ \t\f\v]*(.*)$", re.MULTILINE)
#: A literal operand: ``"x"`` or ``<x>`` (anything else is a macro, expanded by NVRTC).
_OPERAND_RE = re.compile(r'"([^"]+)"|<([^>]+)>')
#: ``__has_include`` / ``__has_include_next`` (C++17): a header's presence decides the code.
_HAS_INCLUDE_RE = re.compile(r"\b__has_include(?:_next)?\b")
#: The key of :func:`_local_headers`'s entry for every file of the include directories.
_ALL_FILES = "<every file of the include directories>"


def _strip_comments(text: str) -> str:
    """``text`` as the preprocessor reads its directives: lines joined at a backslash-newline, and every
    comment replaced by one space (a block comment spanning lines too), so that ``/* x */ #include "d.h"``
    is a directive and a ``#include`` inside a comment is none. String and character literals are kept
    whole (raw strings ``R"(...)"`` are not understood)."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")
    return _LEXEME_RE.sub(lambda m: " " if m.group().startswith(("//", "/*")) else m.group(), text)


def _includes(text: str) -> tuple[list[tuple[str, str]], bool]:
    """``([(quoted, angled), ...], computed)``: the literal ``#include`` operands of ``text`` (one of each pair
    is ``""``), and whether any ``#include`` has another operand (a macro, ``#include HDR``), whose header
    only NVRTC can tell, or the text asks ``__has_include`` (whose answer changes when a header is added
    or removed, so the whole include tree is part of the key)."""
    text = _strip_comments(text)
    literal, computed = [], _HAS_INCLUDE_RE.search(text) is not None
    for operand in _INCLUDE_RE.findall(text):
        m = _OPERAND_RE.match(operand)
        if m:
            literal.append((m.group(1) or "", m.group(2) or ""))
        else:
            computed = True
    return literal, computed


def _local_headers(source: str, search: list[Path], seen=None, here: Path | None = None) -> dict[str, str]:
    """Contents of every ``#include "x"`` and ``#include <x>`` found in ``search`` (recursively), keyed
    by the path under ``search``.

    Resolved as NVRTC does: a header's own ``"x"`` includes are searched in its directory first
    (``here``; ``cu/ddtree/topk.cuh`` including ``"params.cuh"`` finds ``cu/ddtree/params.cuh``),
    then in ``search`` in order; ``<x>`` only in ``search``. The top-level source is compiled as a
    file of ``search[0]`` (:func:`_program_path`), so its own directory adds nothing. A ``<x>`` not
    in ``search`` (``<cuda_bf16.h>``, the compiler's own headers) is not a local header. Comments are
    removed first (:func:`_strip_comments`). A computed include (``#include HDR``, a macro) may name
    any header, and ``__has_include`` may ask for any: then every regular file under ``search``
    (recursively) is hashed too, under the key :data:`_ALL_FILES`.
    """
    seen = {} if seen is None else seen
    literal, computed = _includes(source)
    if computed and _ALL_FILES not in seen:
        seen[_ALL_FILES] = _tree_digest(search)
    for quoted, angled in literal:
        name = quoted or angled
        for d in ([here] if here is not None and quoted else []) + list(search):
            p = d / name
            if not p.is_file():
                continue
            key = _header_key(p, search, name)
            if key not in seen:
                text = p.read_bytes().decode("latin-1")  # any encoding: one char per byte, hashed exactly
                seen[key] = text
                _local_headers(text, search, seen, p.parent)
            break
    return seen


def _tree_digest(dirs: list[Path]) -> str:
    """sha256 over the path (under its directory) and contents of every regular file under ``dirs``,
    recursively (symbolic links followed, each real directory read once)."""
    h = hashlib.sha256()
    done = set()
    for i, d in enumerate(dirs):
        for root, subdirs, files in os.walk(d, followlinks=True):
            real = os.path.realpath(root)
            if real in done:
                subdirs[:] = []
                continue
            done.add(real)
            subdirs.sort()
            for f in sorted(files):
                p = os.path.join(root, f)
                if os.path.isfile(p):
                    rel = os.path.relpath(p, d)
                    with open(p, "rb") as fh:
                        h.update(f"{i}\0{rel}\0".encode() + fh.read() + b"\0\1")
    return h.hexdigest()


def _header_key(path: Path, search: list[Path], name: str) -> str:
    """``path`` relative to the first of ``search`` that holds it (``"ddtree/params.cuh"``), else ``name``."""
    for d in search:
        try:
            return Path(os.path.normpath(path)).relative_to(os.path.normpath(d)).as_posix()
        except ValueError:
            continue
    return name


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_resource_report(log: str) -> dict[str, KernelResources]:
    """Parse ptxas ``-v`` output into ``{kernel_name: KernelResources}``."""
    res: dict[str, dict] = {}
    entry = None
    props_for = None
    for line in log.splitlines():
        m = _ENTRY_RE.search(line)
        if m:
            entry = m.group(1)
            res.setdefault(entry, {})
            continue
        m = _PROPS_RE.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _STACK_RE.search(line)
        if m and props_for in res:
            r = res[props_for]
            r["stack_bytes"], r["spill_store_bytes"], r["spill_load_bytes"] = (int(g) for g in m.groups())
            continue
        m = _USED_RE.search(line)
        if m and entry is not None:
            r = res[entry]
            r["registers"] = int(m.group(1))
            r["shared_bytes"] = int(m.group(2) or 0)
    return {k: KernelResources(**v) for k, v in res.items()}


_DEFINE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Options that select the target: the target is the ``arch`` argument (which also sets
#: ``DL_SMEM_LIMIT``, the cache key and :attr:`Cubin.arch`), never an extra option.
_ARCH_OPTION_RE = re.compile(r"\s*(-arch|--gpu-architecture|-gencode|--generate-code)(\s|=|$)")
#: Options that add include directories or headers: what they bring in would not be part of the
#: cache key (``include_dirs`` is; a header the source includes is).
_INCLUDE_OPTION_RE = re.compile(r"\s*(-I|(--include-path|-include|--pre-include)(\s|=|$))")
#: Options that make NVRTC emit LTO IR instead of a cubin (no cubin to load).
_NO_CUBIN_OPTION_RE = re.compile(r"\s*(-dlto|--dlink-time-opt)(\s|=|$)")
#: Options whose value may be the next item: last in ``extra_options``, NVRTC ignores them silently
#: (``-Xptxas``, ``-maxrregcount``) or says only "invalid macro definition" (``-D``).
_VALUE_OPTIONS = ("-D", "--define-macro", "-U", "--undefine-macro", "-Xptxas", "--ptxas-options", "-Xnvvm",
                  "-maxrregcount", "--maxrregcount", "-dopt", "--dopt", "-split-compile", "--split-compile")


def _str_sequence(name: str, value, *, paths: bool = False) -> tuple:
    """``value`` as a tuple of str (or paths): TypeError naming ``name`` for a lone str/bytes/path
    (which would be split into characters) or an item of another type."""
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} must be a sequence of {'paths' if paths else 'str'}, not a single "
                        f"{type(value).__name__}: write [{value!r}]")
    if value is None:
        return ()
    if isinstance(value, (Mapping, AbstractSet)):
        raise TypeError(f"{name} must be a sequence of {'paths' if paths else 'str'} (a list or tuple, in order), "
                        f"got {type(value).__name__}")
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {'paths' if paths else 'str'}, "
                        f"got {type(value).__name__}") from None
    for i, v in enumerate(items):
        ok = isinstance(v, (str, os.PathLike)) if paths else isinstance(v, str)
        if not ok:
            raise TypeError(f"{name}[{i}] must be a {'str or path' if paths else 'str'}, got {type(v).__name__} {v!r}")
        if not paths and _unencodable_index(v) is not None:  # NVRTC's options are UTF-8 (paths: _check_include_dir)
            raise ValueError(f"{name}[{i}] is not valid Unicode text (a lone surrogate), got {v!r}")
    return items


def _check_include_dir(i: int, d) -> None:
    """TypeError / ValueError naming ``include_dirs[i]`` unless ``d`` names an existing directory."""
    path = os.fspath(d)
    if not isinstance(path, str):
        raise TypeError(f"include_dirs[{i}] must be a str or path, got a path of {type(path).__name__} {d!r}")
    if path == "":
        raise ValueError(f"include_dirs[{i}] is '': an empty path (write '.' for the current directory)")
    if _unencodable_index(path) is not None:  # (it is an NVRTC option, UTF-8, and part of the cache key)
        raise ValueError(f"include_dirs[{i}] is not valid Unicode text (a lone surrogate), got {path!r}")
    if not os.path.isdir(path):
        why = "is a file, not a directory" if os.path.exists(path) else "is not a directory (it does not exist)"
        raise ValueError(f"include_dirs[{i}] {path!r} {why}")


def _check_compile_args(defines, extra_options, include_dirs) -> tuple[dict, tuple, tuple]:
    """``(defines, extra_options, include_dirs)`` checked as :func:`compile_source` documents."""
    extra = _str_sequence("extra_options", extra_options)
    for o in extra:
        if _ARCH_OPTION_RE.match(o):
            raise ValueError(f"extra_options must not select the target ({o!r}): pass the architecture as arch=; "
                             f"it also sets DL_SMEM_LIMIT, the cache key and Cubin.arch")
        if _INCLUDE_OPTION_RE.match(o):
            raise ValueError(f"extra_options must not add include directories or headers ({o!r}): pass the "
                             f"directories as include_dirs= (their headers are part of the cache key) and #include "
                             f"a header in the source")
        if _NO_CUBIN_OPTION_RE.match(o):
            raise ValueError(f"extra_options must not ask for LTO IR instead of a cubin ({o!r}): driverlevel "
                             f"compiles a cubin and loads it as it is")
    if extra and extra[-1].strip() in _VALUE_OPTIONS:
        o = extra[-1].strip()
        raise ValueError(f"extra_options ends with {extra[-1]!r}, which takes a value: give the value as the next "
                         f"item ([..., {o!r}, value])")
    incl = _str_sequence("include_dirs", include_dirs, paths=True)
    for i, d in enumerate(incl):
        _check_include_dir(i, d)
    if defines is None:
        defines = {}
    if not hasattr(defines, "items"):
        raise TypeError(f"defines must be a dict of NAME: value, got {type(defines).__name__}")
    checked = {}
    for k, v in defines.items():
        if not isinstance(k, str):
            raise TypeError(f"defines: a name must be a str, got {type(k).__name__} {k!r}")
        if not _DEFINE_NAME_RE.fullmatch(k):
            raise ValueError(f"defines: {k!r} is not a C identifier")
        if v is None:
            raise TypeError(f"defines[{k!r}] is None: give a value (e.g. 1); a bare -D{k} is not supported")
        if is_bool(v):
            v = bool(v)  # numpy's bool too
        elif isinstance(v, numbers.Integral):
            v = int(v)  # numpy's integers too, as the architecture takes them
        elif isinstance(v, numbers.Real) and not isinstance(v, float):
            v = float(v)  # numpy's floats (np.float64 is already a float)
        elif not isinstance(v, (float, str)):
            raise TypeError(f"defines[{k!r}] must be an int, float, bool or str (or numpy's int, float or bool), "
                            f"got {type(v).__name__} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"defines[{k!r}] must be a finite float, got {v!r} (no C literal)")
        if isinstance(v, str) and any(c in v for c in "\n\r\0"):
            raise ValueError(f"defines[{k!r}] must not contain a line break or NUL character, got {v!r}")
        if isinstance(v, str) and _unencodable_index(v) is not None:
            raise ValueError(f"defines[{k!r}] is not valid Unicode text (a lone surrogate), got {v!r}")
        checked[k] = v
    return checked, extra, incl


def _check_source_and_name(source, name) -> None:
    """TypeError / ValueError for a ``source`` or ``name`` that :func:`compile_source` does not take."""
    if not isinstance(source, str):
        hint = ": decode it first (source.decode())" if isinstance(source, (bytes, bytearray)) else ""
        raise TypeError(f"source must be a str (the CUDA C++ text), got {type(source).__name__}{hint}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (a file name such as 'k.cu'), got {type(name).__name__} {name!r}")
    if os.path.basename(name) in ("", ".", ".."):
        raise ValueError(f"name must end in a file name such as 'k.cu', got {name!r}")
    if "\0" in name:
        raise ValueError(f"name must not contain a NUL character, got {name!r}")
    if "\0" in source:
        raise ValueError(f"source contains a NUL character (at index {source.index(chr(0))}): NVRTC would stop "
                         f"reading there and compile only the text before it")
    for what, text in (("name", name), ("source", source)):
        bad = _unencodable_index(text)
        if bad is not None:
            raise ValueError(f"{what} is not valid Unicode text (a lone surrogate {text[bad]!r} at index {bad}, "
                             f"e.g. from a file read with errors='surrogateescape'): NVRTC takes UTF-8")


def _unencodable_index(text: str):
    """The index of ``text``'s first character that UTF-8 cannot encode (a lone surrogate), or None."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _options(arch: str, defines: dict, extra) -> list[str]:
    opts = [
        f"--gpu-architecture={arch}",
        "--std=c++17",
        "-Xptxas=-v",
        "--device-as-default-execution-space",
        f"-DDL_SMEM_LIMIT={shared_limit(arch)}",
    ]
    if lineinfo_requested():
        opts.append("-lineinfo")
    for k in sorted(defines or {}):
        v = defines[k]
        if isinstance(v, bool):
            v = int(v)
        opts.append(f"-D{k}={v}")
    opts.extend(extra or ())
    return opts


def _cache_key(source, name, headers, options, arch, include) -> str:
    h = hashlib.sha256()
    for part in (_KEY_FORMAT, _PACKAGE_VERSION, repr(nvrtc_version()), arch, name, source, "\0".join(options),
                 "\0".join(include)):
        h.update(part.encode())
        h.update(b"\0\1")
    for hname in sorted(headers):
        for part in (hname, headers[hname]):
            h.update(part.encode())
            h.update(b"\0\1")
    return h.hexdigest()


def _read_entry(path: Path, key: str):
    """Load a cache entry, or None if it is missing, truncated or corrupt.

    Raises ``OSError`` when the entry is there but cannot be read (permissions, a directory in its
    place, an I/O error): :func:`compile_source` says so in a warning and compiles."""
    try:
        blob = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no cache directory) yet: a miss
        return None
    try:
        if blob[:8] != _MAGIC:
            return None
        (hlen,) = struct.unpack_from("<Q", blob, 8)
        header = json.loads(blob[16:16 + hlen].decode())
        data = blob[16 + hlen:]
        if header.get("key") != key or len(data) != header["cubin_bytes"]:
            return None
        if hashlib.sha256(data).hexdigest() != header["cubin_sha256"]:
            return None
        resources = {k: KernelResources(**v) for k, v in header["resources"].items()}
        return Cubin(data, header["arch"], header["source_name"], tuple(header["options"]),
                     resources, header.get("log", ""), True, key)
    except (ValueError, KeyError, TypeError, AttributeError, struct.error, UnicodeDecodeError):
        return None  # (AttributeError: a header or its resources that are not JSON objects)


def _touch_entry(path: Path) -> None:
    """Set a loaded entry's modification time to now (the module docstring says why). An entry this
    process may not change (a read-only or another user's cache) keeps its time: that is a cache
    in use, not a failure, so PermissionError and a read-only file system pass silently; any other
    ``OSError`` warns (the entry is used all the same). Every load writes the time, so a cache on a
    copy-on-write layer (overlayfs, an entry baked into an image) copies each entry it loads up once."""
    try:
        os.utime(path)
    except (PermissionError, FileNotFoundError):  # not ours to change, or removed since it was read
        return
    except OSError as exc:
        import errno

        if exc.errno != errno.EROFS:
            _warn(f"driverlevel: loaded the cubin cache entry {path} but could not set its modification time: "
                  f"{exc.strerror or exc}; the entry is used all the same (its time no longer says when it was "
                  f"last used: age-based pruning and tools/kernel_cache.py export --since may miss it)")


def _create_temporary(directory: Path) -> tuple[int, str]:
    """``(fd, path)`` of a new, empty ``.tmp-*.cubin`` file in ``directory``, open for writing, created with
    mode ``0o666`` less the umask as any file is (``tempfile.mkstemp`` makes ``0o600``: an entry that other
    users of a shared cache could not read)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(6).hex()}.cubin")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no unused temporary file name in {directory}")


def _write_entry(path: Path, cub: Cubin) -> None:
    header = {
        "key": cub.key, "arch": cub.arch, "source_name": cub.source_name, "options": list(cub.options),
        "resources": {k: v.__dict__ for k, v in cub.resources.items()}, "log": cub.log,
        "cubin_bytes": len(cub.data), "cubin_sha256": hashlib.sha256(cub.data).hexdigest(),
    }
    hb = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)  # 0o777 less the umask, parents too
    _write_atomically(path, _MAGIC + struct.pack("<Q", len(hb)) + hb + cub.data)


def _write_atomically(path: Path, data: bytes, mtime: float | None = None) -> None:
    """``data`` as the file ``path`` (its directory exists), whole or not at all: written to a temporary
    file beside it (:func:`_create_temporary`), given ``mtime`` as its times if not None, then renamed
    over ``path``; the temporary file is removed when any step fails, and the error raised."""
    fd, tmp = _create_temporary(path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def compile_source(source: str, name: str, arch, defines: dict | None = None, extra_options=(),
                   use_cache: bool = True, include_dirs: tuple = ()) -> Cubin:
    """Compile CUDA C++ ``source`` to a cubin for ``arch``.

    Parameters
    ----------
    source : str
        CUDA C++ text; kernels should be ``extern "C"`` so their names are plain. No NUL character
        (NVRTC would stop reading there).
    name : str
        File name used in diagnostics and the cache key, e.g. ``"verify_attention.cu"`` (not
        ``"."`` or ``".."``; no NUL character).
    arch : str, tuple, int or Device
        Target architecture, e.g. ``"sm_120"``.
    defines : dict, optional
        Compile-time constants, passed as ``-DNAME=VALUE`` (a bool as 0 / 1). ``NAME`` is a C
        identifier; the value an int, a finite float or a bool (numpy's too), or a str
        without line breaks. ``None`` is refused (no bare
        ``-DNAME``: give a value, e.g. 1).
    extra_options : sequence of str
        More NVRTC options, e.g. ``["-lineinfo"]`` (a list even for one; a lone str is
        refused, not split into characters). Options that select the target
        (``-arch``, ``--gpu-architecture``, ``-gencode``) are refused: the target is ``arch``;
        so are those that add include directories or headers (``-I``, ``--include-path``,
        ``-include``, ``--pre-include``): pass ``include_dirs``; and those that make NVRTC emit
        LTO IR instead of a cubin (``-dlto``, ``--dlink-time-opt``), and a last item that lacks
        its value (``-D``, ``-U``, ``-Xptxas``, ``-maxrregcount`` …). They come after
        driverlevel's own options on NVRTC's command line, and are part of the cache key: with
        ``-fdevice-syntax-only`` (a front-end check only, e.g. for ``static_assert`` messages)
        the result is a cubin with no kernels, cached under a key of its own.
    use_cache : bool
        Use the in-process and disk caches (default True). A bool (numpy's too): ``"no"`` or ``0``
        is a ``TypeError``, not a flag.
    include_dirs : sequence of str or Path
        More directories searched for ``#include "..."`` and ``#include <...>`` before ``cu/``;
        the headers found there are part of the cache key like those of ``cu/`` (all their files,
        recursively, when the source or a header includes through a macro, ``#include HDR``, or asks
        ``__has_include``).
        Each an existing directory (``""`` is refused: write ``"."``). A sequence (list or tuple)
        even for one directory (a lone str or Path, a dict or a set is refused). The current directory is
        never searched (pass ``["."]`` to have it): NVRTC sees the source as the file ``name``
        in the first of these directories (else in ``cu/``), and its diagnostics name it so.

    Returns
    -------
    Cubin
        ``cache_hit`` is True when this call compiled nothing (disk or in-process cache).

    Raises
    ------
    NvrtcError
        On a compile error; the message holds the full NVRTC log.
    ValueError
        For a ``name`` with no file name (``""``, ``"dir/"``, ``"."``, ``".."``), a NUL character in
        ``name`` or ``source``, a lone surrogate (text UTF-8 cannot encode, e.g. read with
        ``errors="surrogateescape"``) in ``name``, ``source``, ``extra_options`` or
        ``include_dirs``, an unsupported architecture, a target-selecting, include or LTO
        option in ``extra_options`` or one last there without its value, an ``include_dirs``
        entry that is ``""`` or no existing directory (the message names ``include_dirs[i]``), a
        define name that is no C identifier, a define value that is a non-finite float or a str
        with a line break, a NUL character or a lone surrogate, or an unrecognised
        ``DRIVERLEVEL_CACHE`` value (:func:`cache_dir`) or ``DRIVERLEVEL_LINEINFO`` value
        (:func:`lineinfo_requested`).
        An architecture the NVRTC in use cannot compile for is
        :class:`~driverlevel.UnsupportedTargetError`, a ValueError.
    TypeError
        For ``source`` or ``name`` not a str (bytes are refused too), ``extra_options`` /
        ``include_dirs`` given as a single str, a dict or a set (or not a sequence of str /
        paths), ``defines`` not a dict, a define value that is None or of another type than
        int (numpy's integers too), float, bool, str, or ``use_cache`` not a bool (``"use_cache must be a bool, got str 'no'"``).
    RuntimeError
        ``cuda.pathfinder``'s ``DynamicLibNotFoundError`` where no NVRTC library can be loaded (the
        ``nvidia-cuda-nvrtc`` wheel, a dependency, not visible to this interpreter).

    Every argument is checked before anything is compiled or read from the cache.

    Warns
    -----
    RuntimeWarning
        When the disk cache cannot be written (e.g. ``DRIVERLEVEL_CACHE_DIR`` names a file), or
        an entry that is there cannot be read (``could not read the cubin cache entry ...``, e.g.
        another user's entry without read permission): the cubin is still compiled and returned;
        the warning points at the caller's line.
    """
    _check_source_and_name(source, name)
    use_cache = bool_arg("use_cache", use_cache)
    defines, extra_options, extra_include = _check_compile_args(defines, extra_options, include_dirs)
    arch = normalize_arch(arch)
    _check_nvrtc_supports(arch)
    local = _include_dirs(extra_include)  # the parameter shadows the module function
    own = _options(arch, defines, ())
    options = own + list(extra_options)
    # The caller's options last: one that takes a separate value (-D, -Werror) and lacks it must not
    # take driverlevel's -I as its value.
    options_all = own + [f"-I{d}" for d in local] + list(extra_options)
    n_local = len(extra_include) + 1  # the caller's directories and cu/; not the CUDA headers
    headers = _local_headers(source, [Path(d) for d in local[:n_local]])
    headers["<cuda headers>"] = _system_headers_digest(tuple(local[n_local:]))
    program = _program_path(local[0], name)
    # The program's path and the local include directories are part of the key: NVRTC writes them into
    # the cubin (__FILE__, device asserts, -lineinfo), so two installs or two include_dirs may differ.
    key = _cache_key(source, name, headers, options, arch, [program] + [str(d) for d in local[:n_local]])
    cdir = cache_dir() if use_cache else None  # an unrecognised DRIVERLEVEL_CACHE: ValueError before compiling
    if use_cache:
        with _mem_lock:
            hit = _mem_cache.get(key)
        if hit is not None:
            return replace(hit, cache_hit=True)
        if cdir is not None:
            try:
                entry = _read_entry(cdir / f"{key}.cubin", key)
            except OSError as exc:  # an unreadable entry must not break compilation either
                _warn(_cache_read_failure(cdir / f"{key}.cubin", exc))
                entry = None
            if entry is not None:
                _touch_entry(cdir / f"{key}.cubin")
                with _mem_lock:
                    _mem_cache[key] = entry
                return entry
    cub = _nvrtc_compile(source, name, arch, options_all, path=program)
    cub.options = tuple(options)
    cub.key = key
    if use_cache:
        with _mem_lock:
            _mem_cache[key] = cub
        if cdir is not None:
            try:
                _write_entry(cdir / f"{key}.cubin", cub)
            except OSError as exc:  # an unwritable cache must not break compilation
                _warn(_cache_write_failure(cdir, exc))
    return cub


def _warn(text: str) -> None:
    """A ``RuntimeWarning`` with ``text``, pointing at the first line outside driverlevel."""
    import warnings

    warnings.warn(text, RuntimeWarning, stacklevel=_stacklevel_outside_package())


def _stacklevel_outside_package() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the calling function that points at the first frame
    outside driverlevel (the user's line, however deep in the package the compile was asked for, e.g.
    from a plan's constructor through :func:`compile_file`), not at driverlevel's own source."""
    pkg = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1  # level 1: the function that calls warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(pkg):
        frame, level = frame.f_back, level + 1
    return level


def _program_path(first_dir: str, name: str) -> str:
    """The name NVRTC is given for the program: ``name``'s file name in ``first_dir`` (the first include
    directory: the caller's first, else ``cu/``, where :func:`compile_file`'s sources really are).

    NVRTC searches the directory of the program's name for ``#include "..."`` first, before the ``-I``
    directories; for a bare name such as ``"argmax.cu"`` that is the current directory, so a
    ``common.cuh`` there replaced cu/'s (and its cubin was cached under cu/'s key). In the first include
    directory the search order is the ``-I`` order, which :func:`_local_headers` hashes.
    (``--no-source-include`` is no fix: it also stops a header's own folder from being searched, which
    ``cu/ddtree/*.cuh`` need.)
    """
    return os.path.join(first_dir, os.path.basename(name))


def _nvrtc_compile(source: str, name: str, arch: str, options: list[str], path: str | None = None) -> Cubin:
    """Compile with NVRTC; ``path`` (default ``name``) is the program's name for NVRTC (see
    :func:`_program_path`); ``name`` is the one in :class:`Cubin`, in errors and in the log (NVRTC's
    mentions of ``path`` are rewritten to ``name``)."""
    prog = check_nvrtc("nvrtcCreateProgram",
                       nvrtc.nvrtcCreateProgram(source.encode(), (path or name).encode(), 0, [], []),
                       arch=arch, source_name=name)
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        from ._errors import program_log

        log = program_log(prog)
        if path and path != name:  # NVRTC names the program by its path; the caller knows it as name
            log = _rename_program(log, path, name)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            if "cannot open source file" in log:
                log += ("\n(driverlevel: #include files are searched in include_dirs and cu/ only, never in the "
                        "current directory or the directory of the name given: pass your header directories as "
                        "include_dirs=[...])")
            raise NvrtcError("nvrtcCompileProgram", nvrtc.nvrtcResult(err).name, log, options, arch, name)
        size = check_nvrtc("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog), prog, options, arch, name)
        if not size:
            raise NvrtcError("nvrtcGetCUBINSize", "EMPTY_CUBIN", "NVRTC produced no cubin: an option of "
                             "extra_options (e.g. -tile-only) makes it emit something else", options, arch, name)
        buf = b" " * size
        check_nvrtc("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, buf), prog, options, arch, name)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return Cubin(bytes(buf), arch, name, tuple(options), parse_resource_report(log), log, False, "")


def _rename_program(log: str, path: str, name: str) -> str:
    """``log`` with every whole mention of ``path`` (followed by ``(``, ``"``, ``:``, a blank or the end of
    a line) replaced by ``name``; a header whose path starts with ``path`` (``inc/k.cuh`` for the
    program ``inc/k.cu``) keeps its name."""
    return re.sub(re.escape(path) + r'(?=[(":\s]|$)', lambda _m: name, log, flags=re.MULTILINE)


def compile_file(filename: str, arch, defines: dict | None = None, extra_options=(), use_cache: bool = True) -> Cubin:
    """Compile the kernel source ``cu/<filename>`` for ``arch``; see :func:`compile_source`.

    ``filename`` is one of :func:`kernel_sources` (a plain name such as ``"argmax.cu"``):
    headers (``common.cuh``), paths into or out of ``cu/`` and absolute paths are refused.

    ``defines`` are the launcher's: every kernel file but ``mla_model.cu`` and ``selftest.cu``
    needs them and stops at an ``#error`` naming where they come from when they are missing. Take
    them from a variant of ``driverlevel.cli.compile_variants(filename, arch)`` (its ``defines``,
    exactly as the launcher passes them, so both share a cache entry) or from the launcher
    module's ``compile_defines`` / ``compile_variants`` (e.g. ``driverlevel.argmax``), and
    compile for the variant's ``target`` where it has one (``v.target or arch``: ``"sm_90a"`` for
    sm_90's wgmma verify-attention tile, whose source stops at an ``#error`` for plain sm_90).

    Example
    -------
    >>> from driverlevel.cli import compile_variants                      # doctest: +SKIP
    >>> v = compile_variants("argmax.cu", "sm_90")[0]                     # doctest: +SKIP
    >>> compile_file("argmax.cu", v.target or "sm_90", v.defines)         # doctest: +SKIP

    Raises
    ------
    FileNotFoundError
        If ``filename`` is not one of :func:`kernel_sources` (the message lists them).
    TypeError
        If ``filename`` is not a str (or path), or ``use_cache`` not a bool (before the file is read);
        as :func:`compile_source` for the other arguments.
    ValueError
        As :func:`compile_source`.
    """
    bool_arg("use_cache", use_cache)
    if not isinstance(filename, (str, os.PathLike)):
        raise TypeError(f"filename must be a kernel source name (str), got {type(filename).__name__} {filename!r}")
    name = os.fspath(filename)
    available = kernel_sources()
    if name not in available:
        raise FileNotFoundError(f"no kernel source {name!r} in {kernel_source_dir()}: filename must be one of "
                                f"kernel_sources(): {', '.join(available)}")
    path = kernel_source_dir() / name
    return compile_source(path.read_text(), name, arch, defines, extra_options, use_cache)
