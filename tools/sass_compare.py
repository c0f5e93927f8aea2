"""Does a kernel source change change the code? The SASS of a kernel file at a git revision against the
working tree's, kernel by kernel, without a GPU.

A refactor of a hot loop (a helper shared by two loops, a renamed variable) can only be landed without
a device run if the machine code stays what was measured. This compiles every variant
``driverlevel compile`` builds (the launchers' ``compile_variants``) of one file of ``cu/`` on each
``--arch``, once from the revision's tree (``git archive``: its kernels and its launchers' defines)
and once from the working tree, disassembles both (``tools/sass.py``) and says per kernel:

* ``identical``: the same instructions in the same order, branches to the same instructions
  (addresses and label numbers aside);
* ``same opcodes``: the same multiset of opcodes with their modifiers (``IMAD.MOV.U32``) and the
  same count, but other registers or another order of independent instructions: ptxas scheduled
  the same work differently (read the diff with ``tools/sass.py`` if it is in a hot loop);
* ``differs``: the opcode counts that changed.

``tools/code_sections.py`` answers the stricter question (is every code section bit for bit the
same, over all files, from two snapshots); this one names the kernels that moved and how.

The revision must hold ``driverlevel/runtime.py`` and ``driverlevel/cli.py`` (2026-12-01 on), whose
compile entry points the comparison calls in its tree; an older one is a usage error.

Exits 0 when no kernel ``differs``, 1 otherwise, 2 for a usage error or a failed compile::

    python tools/sass_compare.py ddtree.cu --rev HEAD --arch all
    python tools/sass_compare.py mla_model.cu --rev main~3 --arch sm_90 --arch sm_120
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from sass import disassemble  # noqa: E402  (tools/sass.py)

_PRED = re.compile(r"^@!?U?P\w+\s+")

#: Run in a tree (its own driverlevel on PYTHONPATH): every variant's cubins of FILE on ARCHS, as JSON.
_DUMP = r"""
import base64, json, sys
from driverlevel.cli import compile_variants
from driverlevel.runtime import compile_file
file, archs = sys.argv[1], sys.argv[2:]
out = {}
for arch in archs:
    for i, v in enumerate(compile_variants(file, arch)):
        out[f"{arch} [{v.label or 'the only variant'}]"] = base64.b64encode(
            compile_file(file, v.target or arch, v.defines).data).decode()
json.dump(out, sys.stdout)
"""


def opcode(ins: str) -> str:
    """The opcode with its modifiers of one SASS instruction (its predicate dropped)."""
    return _PRED.sub("", ins).split()[0]


_LABEL = re.compile(r"\.L_x_\d+")


def _resolved(listing: list[str]) -> list[str]:
    """The instructions of a listing with labels (``tools/sass.py``'s ``labels=True``), each branch
    label replaced by the index of the instruction it marks: label numbers drop out (a kernel added
    before another renumbers the other's labels), where the branches go stays."""
    at: dict[str, int] = {}
    ins: list[str] = []
    for e in listing:
        if e.endswith(":") and _LABEL.fullmatch(e[:-1]):
            at[e[:-1]] = len(ins)
        else:
            ins.append(e)
    return [_LABEL.sub(lambda m: f"@{at.get(m.group(0), m.group(0))}", i) for i in ins]


def instructions(listing: list[str]) -> list[str]:
    """The listing without its label entries."""
    return [e for e in listing if not (e.endswith(":") and _LABEL.fullmatch(e[:-1]))]


def classify(before: list[str], after: list[str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """``("identical" | "same opcodes" | "differs", {opcode: (count before, count after)})`` of two
    listings (label entries allowed: ``tools/sass.py``'s ``labels=True``); the dict holds only the
    opcodes whose counts differ (empty unless ``differs``). Branch targets are compared as the
    instructions they mark (``_resolved``), not by label number."""
    if _resolved(before) == _resolved(after):
        return "identical", {}
    before, after = instructions(before), instructions(after)
    cb, ca = Counter(map(opcode, before)), Counter(map(opcode, after))
    if cb == ca:
        return "same opcodes", {}
    return "differs", {k: (cb[k], ca[k]) for k in sorted(cb.keys() | ca.keys()) if cb[k] != ca[k]}


def cubins(tree: Path, file: str, archs: list[str], use_cache: bool = True) -> dict[str, bytes]:
    """``{"<arch> [<variant>]": cubin}`` of every variant of ``file``, compiled by ``tree``'s driverlevel
    (without the disk cache for a temporary tree: its path is part of every entry's key, so its
    entries could never be hit again). A failed compile exits 2 with NVRTC's message."""
    env = {**os.environ, "PYTHONPATH": str(tree), **({} if use_cache else {"DRIVERLEVEL_CACHE": "0"})}
    r = subprocess.run([sys.executable, "-c", _DUMP, file, *archs], cwd=tree, capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        print(f"tools/sass_compare.py: compiling {file} in {tree} failed:\n{r.stderr.strip()}", file=sys.stderr)
        raise SystemExit(2)
    return {k: base64.b64decode(v) for k, v in json.loads(r.stdout).items()}


def main(argv=None) -> int:
    from driverlevel._compile import check_compile_options
    from driverlevel.cli import LAUNCHERS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", choices=sorted(LAUNCHERS), help="kernel file of cu/")
    ap.add_argument("--rev", default="HEAD", help="the git revision to compare the working tree with (default HEAD)")
    ap.add_argument("--arch", action="append", default=None,
                    help="target architectures, comma separated or the option repeated, or 'all' (sm_80, sm_86, "
                         "sm_89, sm_90, sm_100, sm_120), as `driverlevel compile --arch` takes them; default sm_90 "
                         "and sm_120")
    args = ap.parse_args(argv)
    try:  # (--arch, then DRIVERLEVEL_CACHE / _LINEINFO: usage errors, not a compile's traceback)
        archs = check_compile_options(args.arch or ["sm_90", "sm_120"])
    except ValueError as e:
        ap.error(str(e))
    rev = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.rev}^{{commit}}"], cwd=REPO,
                         capture_output=True, text=True)
    if rev.returncode != 0:
        ap.error(f"--rev {args.rev!r} is not a commit of {REPO}")
    # (the revision's own driverlevel compiles: _DUMP imports what it needs, and with an editable
    # install a module the old tree lacks would come from the working tree instead, silently)
    for need in (f"cu/{args.file}", "driverlevel/runtime.py", "driverlevel/cli.py"):
        if subprocess.run(["git", "cat-file", "-e", f"{rev.stdout.strip()}:{need}"], cwd=REPO,
                          capture_output=True).returncode != 0:
            ap.error(f"--rev {args.rev!r} has no {need}, which the comparison compiles with: pick a later "
                     f"revision (`git log --diff-filter=A --format=%h -- {need}` names the one that added it)")
    with tempfile.TemporaryDirectory() as d:
        old_tree = Path(d)
        archive = subprocess.run(["git", "archive", rev.stdout.strip()], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
        if not (old_tree / "cu" / args.file).exists():
            ap.error(f"{args.file} does not exist at {args.rev}")
        old = cubins(old_tree, args.file, archs, use_cache=False)
    new = cubins(REPO, args.file, archs)
    changed = 0
    for key in sorted(old.keys() | new.keys()):
        if key not in old or key not in new:
            print(f"{args.file} {key}: only {'after' if key in new else 'before'}")
            changed += 1
            continue
        kb, ka = disassemble(old[key], labels=True), disassemble(new[key], labels=True)
        for name in sorted(kb.keys() | ka.keys()):
            if name not in kb or name not in ka:
                print(f"{key} {name}: only {'after' if name in ka else 'before'}")
                changed += 1
                continue
            verdict, counts = classify(kb[name], ka[name])
            changed += verdict == "differs"
            line = f"{key} {name}: {verdict} ({len(instructions(kb[name]))} -> {len(instructions(ka[name]))} instructions)"
            if counts:
                line += "; " + ", ".join(f"{k} {b} -> {a}" for k, (b, a) in list(counts.items())[:12])
            print(line)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/sass_compare.py"))
