"""tools/ddtree_stamps.py without a GPU: its argument checks, the turning of the kernel's stamp
records into per-phase cycles and a global-timer timeline, and the stamped ddtree.cu compiling
(NVRTC) with its record globals while the plain build stays free of the instrumentation."""

import importlib.util
from pathlib import Path

import pytest

import driverlevel as dl
from driverlevel import ddtree

_spec = importlib.util.spec_from_file_location("ddtree_stamps", Path(__file__).parents[1] / "tools" / "ddtree_stamps.py")
stamps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stamps)


def test_argument_ranges():
    assert stamps.parse_args([]).batch == [1, 8]
    with pytest.raises(SystemExit):
        stamps.parse_args(["--batch", "0"])
    with pytest.raises(SystemExit):
        stamps.parse_args(["--budget", "600"])
    assert stamps.parse_args([]).detail_depth is None
    for bad in ("0", "16"):
        with pytest.raises(SystemExit):
            stamps.parse_args(["--detail-depth", bad])
    assert stamps.stamp_defines() == {"DL_STAMPS": 1}
    assert stamps.stamp_defines(2) == {"DL_STAMPS": 1, "DL_STAMPS_DETAIL": 2}


def test_scalar_options_name_the_bad_value_not_a_list(capsys):
    """Review 38: ``--spin-us -1`` said "got [-1]" (the range check's list, for a scalar option)."""
    for argv, words in ((["--spin-us", "-1"], "--spin-us must be in 0..100000, got -1\n"),
                        (["--repeat", "0"], "--repeat must be in 1..50, got 0\n"),
                        (["--batch", "1", "40"], "--batch must be in 1..16, got [40]\n")):
        with pytest.raises(SystemExit):
            stamps.parse_args(argv)
        assert capsys.readouterr().err.endswith(words)


def _records():
    """Two CTAs of request 0, as read_stamps returns them: (point, arg, clock, global timer ns)."""
    row3 = [("merge", 0, 1000, 10_000), ("loaded", 1500, 1400, 10_200), ("selected", 0, 2400, 10_700),
            ("lse", 0, 2500, 10_750), ("sorted", 0, 3100, 11_050)]
    row7 = [("merge", 0, 50, 9_000), ("loaded", 1400, 350, 9_150), ("selected", 0, 1550, 9_750),
            ("lse", 0, 1650, 9_800), ("sorted", 0, 2150, 10_050), ("last", 0, 2300, 11_200),
            ("lp", 0, 2700, 11_400), ("depth", 1, 2900, 11_500), ("depth", 2, 3400, 11_750),
            ("generated", 90, 3500, 11_800), ("searched", 256, 4500, 12_300), ("nodes", 257, 5000, 12_550)]
    return {3: row3, 7: row7}


def test_records_to_phases():
    ph = stamps.phases(_records())
    assert sorted(ph["loaded"]) == [300, 400] and sorted(ph["selected"]) == [1000, 1200]
    assert ph["depth  1"] == [200] and ph["depth  2"] == [500] and ph["searched"] == [1000]
    assert ph["lp"] == [400] and ph["last"] == [150]
    rows = stamps.report(ph, 2_000_000, stamps.order_of(_records()))
    names = [r.split()[0] if not r.startswith("depth") else r[:8] for r in rows[1:]]
    assert names == ["loaded", "selected", "lse", "sorted", "last", "lp", "depth  1", "depth  2",
                     "generated", "searched", "nodes"]
    assert rows[1].split()[2] == "350"  # median of 300 and 400 cycles


def test_row_counts_from_the_merge_stamps_arguments():
    rows = _records()
    rows[3][2] = ("selected", 1, 2400, 10_700)            # one level, nothing gathered
    rows[7][2] = ("selected", 2 + 64 * 7, 1550, 9_750)    # two levels, seven gathered
    assert stamps.row_counts(rows) == ["candidates per row (loaded): 1400 / 1450 / 1500 over 2 rows",
                                       "select per row (selected): levels 1 / 1.5 / 2, gathered 0 / 3.5 / 7 over 2 rows"]
    assert stamps.row_counts({0: [("merge", 0, 1, 1)]}) == []
    rows[3][2] = ("selected", -1, 2400, 10_700)           # ranked by the merge's histogram
    assert stamps.row_counts(rows) == ["candidates per row (loaded): 1400 / 1450 / 1500 over 2 rows",
                                       "rows ranked by the merge's histogram (selected): 1 of 2",
                                       "select per row (selected): levels 2 / 2 / 2, gathered 7 / 7 / 7 over 1 rows"]


def test_point_names_carry_the_depth_or_the_pop_count():
    assert stamps.point_name("depth", 3) == "depth  3"
    assert stamps.point_name("pop", 8) == "pop   8" and stamps.point_name("pop", 60) == "pop  60"
    assert stamps.point_name("lp", 0) == "lp"


def test_the_code_warmer_stays_out_of_the_tables():
    """ddtree_build's CTA (depth_limit, 0), stamp row depth_limit, runs the search on its own data; an
    inactive request's CTA (only an ``entry`` point, no ``merge`` either) stays in the tables."""
    warmer = [("entry", 0, 10, 8_000), ("lp", 0, 400, 8_300), ("searched", 20, 900, 8_600), ("nodes", 21, 1200, 8_700)]
    inactive = [("entry", 0, 20, 8_100)]
    rows, rest = stamps.split_warmer({**_records(), 15: warmer, 40: inactive}, 15)
    assert rows == {**_records(), 40: inactive} and rest == warmer
    assert stamps.split_warmer(_records(), 15) == (_records(), [])
    # the second warmer, CTA (depth_limit, 1) (from batch 2, budgets <= 16): stamp row 16 + 15 = 31
    second = [("entry", 0, 10, 8_050), ("lp", 0, 300, 8_200)]
    rows, rest = stamps.split_warmer({**_records(), 15: warmer, 31: second}, 15, 1)
    assert rows == {**_records(), 15: warmer} and rest == second


def test_the_code_warmers_points_are_listed_in_time_order_from_the_first_merge():
    warmer = [("searched", 20, 900, 9_600), ("entry", 0, 10, 6_000), ("depth", 2, 700, 9_100)]
    assert stamps.warmer_points(warmer, 7_000) == "entry -1.00, depth  2 2.10, searched 2.60"


def test_records_are_taken_in_clock_order_not_slot_order():
    # the search's prologue has a high slot but comes right after "lp"
    recs = {0: [("lp", 0, 100, 1_000), ("depth", 1, 400, 1_300), ("srchpro", 0, 150, 1_050)]}
    ph = stamps.phases(recs)
    assert ph["srchpro"] == [50] and ph["depth  1"] == [250] and "lp" not in ph
    assert stamps.order_of(recs) == ["lp", "srchpro", "depth  1"]


def test_raw_records_by_row():
    import numpy as np

    recs = np.zeros((stamps.phase_stamps.ROWS, stamps.phase_stamps.POINTS, 4), np.uint64)
    name = int.from_bytes(b"loaded", "little")
    recs[5, 1] = (name, 1400, 9_150, 1500)
    recs[5, 0] = (int.from_bytes(b"merge", "little"), 1000, 9_000, 0)
    recs[9, 3] = (int.from_bytes(b"depth", "little"), 77, 12, np.uint64(2**64 - 1))  # arg -1
    rows = stamps.phase_stamps.records_by_row(recs)
    assert sorted(rows) == [5, 9]
    assert rows[5] == [("merge", 0, 1000, 9_000), ("loaded", 1500, 1400, 9_150)]  # slot order
    assert rows[9] == [("depth", -1, 77, 12)]


def test_records_to_timeline():
    rows = stamps.timeline(_records())
    by = {r[:12].strip(): r.split()[-4:] for r in rows[1:]}
    assert by["merge"] == ["2", "0.00", "0.50", "1.00"]  # µs from the first CTA's merge (9,000 ns)
    assert by["sorted"] == ["2", "1.05", "1.55", "2.05"]
    assert by["depth  2"] == ["1", "2.75", "2.75", "2.75"] and by["nodes"] == ["1", "3.55", "3.55", "3.55"]
    assert stamps.timeline({0: [("loaded", 0, 1, 1)]}) == ["(no merge point recorded)"]
    assert rows[0].split()[:2] == ["point", "rows"]


def test_stamped_build_compiles_with_its_globals_and_the_plain_one_is_unchanged():
    plain = dl.runtime.compile_file("ddtree.cu", "sm_90", ddtree.compile_defines("sm_90"))
    stamped = dl.runtime.compile_file("ddtree.cu", "sm_90", {**ddtree.compile_defines("sm_90"), "DL_STAMPS": 1})
    assert stamped.resources["ddtree_build"].spills == 0
    assert b"dl_stamps" in stamped.data
    assert b"dl_stamp" not in plain.data
    assert plain.resources["ddtree_build"].stack_bytes == 0


def test_detail_stamps_compile_and_leave_the_plain_build_unchanged():
    """--detail-depth's build (DL_STAMPS_DETAIL) compiles without spills and stamps its five step
    names; DDT_DETAIL is empty without DL_STAMPS, so the plain cubin does not change."""
    plain_defines = ddtree.compile_defines("sm_90")
    detail = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, **stamps.stamp_defines(2)})
    assert detail.resources["ddtree_build"].spills == 0
    only_detail = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, "DL_STAMPS_DETAIL": 2})
    plain = dl.runtime.compile_file("ddtree.cu", "sm_90", plain_defines)
    assert only_detail.data == plain.data


def test_twice_build_compiles_and_leaves_the_plain_build_unchanged():
    """--twice's build (DL_STAMPS_TWICE with DL_STAMPS) compiles for the H200 without spills or stack,
    and runs the merge and the search twice through one copy of their code each (a loop at one call
    site): its cubin is ~3 KB larger than the stamped build's, where a second inlined copy of the
    search made it ~64 KB larger (the first version of the define); the second runs must execute
    the instructions the first fetched. Without DL_STAMPS the define changes nothing, so a stray
    define cannot double a plan's merge."""
    plain_defines = ddtree.compile_defines("sm_90")
    assert stamps.stamp_defines(None, twice=True) == {"DL_STAMPS": 1, "DL_STAMPS_TWICE": 1}
    assert stamps.parse_args(["--twice"]).twice and not stamps.parse_args([]).twice
    twice = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, **stamps.stamp_defines(None, True)})
    assert twice.resources["ddtree_build"].spills == 0 and twice.resources["ddtree_build"].stack_bytes == 0
    stamped = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, **stamps.stamp_defines()})
    assert len(twice.data) < len(stamped.data) + 16 * 1024
    only_twice = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, "DL_STAMPS_TWICE": 1})
    assert only_twice.data == dl.runtime.compile_file("ddtree.cu", "sm_90", plain_defines).data


def test_rowseen_stream_compiles_and_leaves_the_other_builds_unchanged():
    """--rowseen's stream kernels (DL_STAMPS_ROWSEEN with DL_STAMPS: thread 0 polls its row's sample
    exit record before the PDL wait) compile for the H200 within the stream's launch bounds, without
    spills or stack; the define changes the stamped cubin but not the plain one, so a stray define
    cannot put a poll into a plan's stream."""
    plain_defines = ddtree.compile_defines("sm_90")
    assert stamps.stamp_defines(None, rowseen=True) == {"DL_STAMPS": 1, "DL_STAMPS_ROWSEEN": 1}
    assert stamps.parse_args(["--rowseen"]).rowseen and not stamps.parse_args([]).rowseen
    seen = dl.runtime.compile_file("ddtree.cu", "sm_90",
                                   {**plain_defines, **stamps.stamp_defines(None, rowseen=True)})
    stamped = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, **stamps.stamp_defines()})
    for name in ("ddtree_topk_stream_f32", "ddtree_topk_stream_bf16"):
        r = seen.resources[name]
        assert r.spills == 0 and r.stack_bytes == 0 and r.registers <= 64, (name, r)
    assert seen.data != stamped.data
    only_seen = dl.runtime.compile_file("ddtree.cu", "sm_90", {**plain_defines, "DL_STAMPS_ROWSEEN": 1})
    assert only_seen.data == dl.runtime.compile_file("ddtree.cu", "sm_90", plain_defines).data


def test_stamp_names_are_immediates_in_the_code():
    """A stamp's name is packed at compile time (dl_stamp_name): the stamped PTX holds 'merge' as a
    64-bit immediate and no string literal, so a stamp is one store and no loads."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from ptx_util import ptx_of

    from driverlevel._compile import kernel_source_dir

    src = (kernel_source_dir() / "ddtree.cu").read_text()
    ptx = ptx_of(src, "ddtree.cu", "sm_90", {**ddtree.compile_defines("sm_90"), "DL_STAMPS": 1})
    assert str(int.from_bytes(b"merge", "little")) in ptx
    assert "$str" not in ptx and "merge" not in ptx


def test_measured_clock_from_the_global_timer():
    """clock64 cycles over %globaltimer ns per CTA (row 7: 4950 cycles in 3550 ns; row 3 spans only
    1050 ns and is left out at the default 2 µs, kept at 1 µs), so a lowered SM clock shows."""
    recs = _records()
    assert stamps.measured_clock_ghz(recs) == pytest.approx(4950 / 3550)
    assert stamps.measured_clock_ghz(recs, min_ns=1000) == pytest.approx((2100 / 1050 + 4950 / 3550) / 2)
    assert stamps.measured_clock_ghz({3: recs[3]}) is None


def test_topk_rows_are_split_off_and_named_by_kernel():
    """--chain: the top-K kernels' rows (DDT_TK_ROW_* of cu/ddtree/stamps.cuh) leave the build's tables
    and come back named by kernel, the chain's timeline starting at the sample's first entry."""
    recs = {3: [("merge", 0, 100, 14_000), ("sorted", 0, 900, 26_000), ("last", 0, 950, 27_000)],
            256: [("entry", 0, 5, 1_000), ("exit", 0, 50, 6_000)],
            600: [("entry", 0, 7, 1_500), ("waited", 0, 9, 7_000), ("exit", 0, 20, 11_000)],
            4700: [("entry", 0, 1, 9_000), ("waited", 0, 2, 12_000), ("exit", 0, 3, 13_000)]}
    build, topk = stamps.split_topk(recs)
    assert set(build) == {3} and set(topk) == {256, 600, 4700}
    assert [p for p, *_ in topk[600]] == ["stream entry", "stream waited", "stream exit"]
    assert topk[256][0][0] == "sample entry" and topk[4700][2][0] == "chunks exit"
    lines = stamps.chain_timeline(build, topk)
    names = [ln[:14].strip() for ln in lines[1:]]
    assert names == ["sample entry", "sample exit", "stream entry", "stream waited", "stream exit", "chunks entry",
                     "chunks waited", "chunks exit", "build merge", "build sorted", "build last"]
    assert lines[1].split()[-1] == "0.00"  # the sample's first entry is the origin
    assert lines[-1].split()[-1] == "26.00"  # build last: 27,000 ns - 1,000 ns
    args = stamps.parse_args(["--chain", "--flush", "read", "--evict-code"])
    assert args.chain and args.flush == "read" and args.evict_code
    assert stamps.parse_args([]).flush == "none" and not stamps.parse_args([]).evict_code


def test_a_chunked_chain_counts_from_the_chunk_kernel():
    """--topk chunked --chain: no sample kernel, so the timeline starts at the chunk kernel's first
    entry (it printed "(no sample entry point recorded)" before); --topk is parsed and defaults to
    threshold."""
    recs = {3: [("merge", 0, 100, 24_000), ("sorted", 0, 900, 30_000)],
            4700: [("entry", 0, 1, 2_000), ("exit", 0, 3, 20_000)],
            4701: [("entry", 0, 1, 3_000), ("exit", 0, 3, 21_000)]}
    build, topk = stamps.split_topk(recs)
    assert stamps.chain_origin(topk) == "chunks entry"
    lines = stamps.chain_timeline(build, topk)
    assert [ln[:14].strip() for ln in lines[1:]] == ["chunks entry", "chunks exit", "build merge", "build sorted"]
    assert lines[1].split()[-3] == "0.00" and lines[-1].split()[-1] == "28.00"  # 30,000 - 2,000 ns
    assert stamps.chain_origin({256: [("sample entry", 0, 5, 1_000)], 4700: [("chunks entry", 0, 1, 900)]}) \
        == "sample entry"
    assert stamps.parse_args(["--topk", "chunked"]).topk == "chunked" and stamps.parse_args([]).topk == "threshold"
    with pytest.raises(SystemExit):
        stamps.parse_args(["--topk", "fused"])


def test_stamp_rows_of_the_kernels_do_not_overlap():
    """Every kernel of a stamped build writes rows of its own: the check passes for bench_ddtree's
    shapes at batch 1, 8 and 16 on a 132-SM GPU and refuses a grid that would spill into the next
    kernel's rows; --batch stops at 16."""
    from types import SimpleNamespace

    from driverlevel import _topk_threshold as tk

    for batch in (1, 8, 16):
        nseg, _ = tk.stream_segments(batch * 15, 163_840, False, 132)
        plan = SimpleNamespace(max_batch=batch, depth_limit=15, tk_nseg=nseg, num_chunks=22, topk="threshold",
                               device=SimpleNamespace(sm_count=132))
        stamps.check_stamp_rows(plan)
    plan = SimpleNamespace(max_batch=17, depth_limit=15, tk_nseg=1, num_chunks=22, topk="threshold",
                           device=SimpleNamespace(sm_count=132))
    with pytest.raises(ValueError, match="ddtree_build 272 CTAs > 256 rows"):
        stamps.check_stamp_rows(plan)
    with pytest.raises(SystemExit):
        stamps.parse_args(["--batch", "17"])


def test_stamp_row_layout_matches_the_headers():
    """The tools' stamp-row layout is the kernels': ROWS and POINTS are cu/phase_stamps.cuh's
    DL_STAMP_ROWS and DL_STAMP_POINTS, TK_ROWS the DDT_TK_ROW_* of cu/ddtree/stamps.cuh (a drift would
    mix or drop records silently; read_stamps only checks the total size)."""
    import re

    cu = Path(__file__).parents[1] / "cu"

    def define(path, name):
        m = re.search(rf"^#define {name} (\d+)", (cu / path).read_text(), re.M)
        assert m, f"{name} not in {path}"
        return int(m.group(1))

    assert stamps.phase_stamps.ROWS == define("phase_stamps.cuh", "DL_STAMP_ROWS")
    assert stamps.phase_stamps.POINTS == define("phase_stamps.cuh", "DL_STAMP_POINTS")
    assert dict(stamps.TK_ROWS) == {k: define("ddtree/stamps.cuh", f"DDT_TK_ROW_{k.upper()}")
                                   for k in ("sample", "stream", "chunks")}
    assert stamps.TK_ROWS[-1][1] < stamps.phase_stamps.ROWS


def test_stream_ctas_grouped_by_sm():
    """--chain: the stream's CTAs grouped by how many shared an SM (the top-K stamps' argument is the
    SM): SM 5 ran two CTAs (exits 9 and 11 µs after the sample's first entry, 7 and 8 µs after their
    PDL waits), SM 9 one (exit at 6, 4 after its wait); the sample's row only sets the origin."""
    recs = {256: [("entry", 1, 5, 1_000), ("exit", 1, 50, 6_000)],
            512: [("entry", 5, 7, 1_500), ("waited", 5, 9, 3_000), ("exit", 5, 20, 10_000)],
            513: [("entry", 5, 7, 1_600), ("waited", 5, 9, 4_000), ("exit", 5, 20, 12_000)],
            514: [("entry", 9, 7, 1_700), ("waited", 9, 9, 3_000), ("exit", 9, 20, 7_000)]}
    _, topk = stamps.split_topk(recs)
    lines = stamps.stream_by_sm(topk)
    assert lines[0].split()[:3] == ["CTAs", "/", "SM"]
    one, two = (ln.split() for ln in lines[1:])
    assert one == ["1", "1", "1", "6.00", "6.00", "4.00"]
    assert two == ["2", "1", "2", "10.00", "11.00", "7.50"]
    assert stamps.stream_by_sm({}) == ["(no sample entry recorded)"]


def test_vocab_argument_is_checked_before_any_gpu_work(capsys):
    assert stamps.parse_args([]).vocab == 163_840
    assert stamps.parse_args(["--vocab", "32768", "--budget", "16"]).vocab == 32_768  # the demo step's
    for argv, words in ((["--vocab", "500"], "--vocab must be a multiple of 8, >= 512, got 500\n"),
                        (["--vocab", "32772"], "--vocab must be a multiple of 8, >= 512, got 32772\n")):
        with pytest.raises(SystemExit):
            stamps.parse_args(argv)
        assert capsys.readouterr().err.endswith(words)
    too_many = None  # a vocabulary whose chunks x budget pass the merge's capacity (DDTreePlan refuses it)
    for v in (2**20, 2**22, 2**24):
        try:
            ddtree.check_merge_capacity(v, 512)
        except ValueError:
            too_many = v
            break
    assert too_many is not None
    with pytest.raises(SystemExit):
        stamps.parse_args(["--vocab", str(too_many), "--budget", "512"])
    assert f"--vocab {too_many} with budget 512" in capsys.readouterr().err


def test_repeat_and_spin_arguments():
    args = stamps.parse_args([])
    assert args.repeat == 1 and args.spin_us == 500
    args = stamps.parse_args(["--repeat", "5", "--spin-us", "2000"])
    assert args.repeat == 5 and args.spin_us == 2000
    for bad in (["--repeat", "0"], ["--repeat", "51"], ["--spin-us", "-1"], ["--spin-us", "100001"]):
        with pytest.raises(SystemExit):
            stamps.parse_args(bad)


def test_repeat_lines_give_each_builds_phase_medians_and_end():
    """--repeat: one line per build, the median µs of the merge's select, placing and sort and of the
    search, and the end (last nodes from the first merge); a phase no CTA passed is '-'."""
    fast = _records()
    slow = {k: [(p, a, c0 + 2 * (c - c0), g) for p, a, c, g in v] for k, v in _records().items()
            for c0 in [v[0][2]]}  # every phase twice as long in clock cycles
    no_search = {3: _records()[3]}
    lines = stamps.repeat_lines([fast, slow, no_search], 2_000_000)  # 2 GHz: 2,000 cycles per µs
    assert lines[0].split() == ["build", "selected", "lse", "sorted", "searched", "end", "µs"]
    assert lines[1].split() == ["1", "0.55", "0.05", "0.28", "0.50", "3.55"]  # selected: median of 1000, 1200 cyc
    assert lines[2].split() == ["2", "1.10", "0.10", "0.55", "1.00", "3.55"]  # the global timer is unchanged
    assert lines[3].split() == ["3", "0.50", "0.05", "0.30", "-", "-"]


def test_launch_gaps_name_a_kernel_whose_launch_came_late():
    """A kernel entering > 5 µs after the previous one's last exit (PDL: it enters before) is named;
    overlapping launches give no line."""
    build = {3: [("entry", 0, 1, 30_000), ("merge", 0, 100, 31_000)]}
    topk = {256: [("sample entry", 0, 5, 1_000), ("sample exit", 0, 50, 4_000)],
            600: [("stream entry", 0, 7, 18_500), ("stream exit", 0, 20, 25_000)],
            4700: [("chunks entry", 0, 1, 24_000), ("chunks exit", 0, 3, 26_000)]}
    lines = stamps.launch_gaps(build, topk)
    assert len(lines) == 1 and lines[0].startswith("late launch: the stream kernel's first CTA entered 14.50 µs "
                                                   "after the sample kernel's last exit")
    build[3][0] = ("entry", 0, 1, 33_000)  # 7 µs after the chunk kernel's exit
    lines = stamps.launch_gaps(build, topk)
    assert len(lines) == 2 and lines[1].startswith("late launch: ddtree_build's first CTA entered 7.00 µs")
    topk[600][0] = ("stream entry", 0, 7, 2_000)
    build[3][0] = ("entry", 0, 1, 25_500)
    assert stamps.launch_gaps(build, topk) == []
    del topk[4700]  # the threshold chain: ddtree_build follows the stream
    build[3][0] = ("entry", 0, 1, 31_000)
    lines = stamps.launch_gaps(build, topk)
    assert len(lines) == 1 and lines[0].startswith("late launch: ddtree_build's first CTA entered 6.00 µs "
                                                   "after the stream kernel's last exit")


def test_every_bench_drafter_is_a_choice():
    """--drafter takes every one of bench_ddtree's drafter kinds (the tool lists them itself: it
    imports the bench only after parsing); an unknown kind is refused."""
    from bench_util import load_bench
    for k in load_bench("bench_ddtree").DRAFTER_BOOSTS:
        assert stamps.parse_args(["--drafter", k]).drafter == k
    with pytest.raises(SystemExit):
        stamps.parse_args(["--drafter", "nope"])
