// constants.cuh: the constants that the kernels share with Python.
//
// Their one source is driverlevel/_constants.py (documented there): the launchers pass every
// one of them as -DDL_<NAME>=<value> (driverlevel._constants.kernel_defines(), part of
// ddtree.compile_defines() and runner.compile_defines()), and a compile without them stops
// here (ddtree.cu and runner.cu stop earlier, at a check of their own full set). Kernel sources use the DL_<NAME> macros, or name them in their own namespace as
// `constexpr int NAME = DL_NAME;` (never a value of their own).
#pragma once

#ifndef DL_STATUS_POOL_EXHAUSTED
#error "DL_STATUS_POOL_EXHAUSTED is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_STATUS_CONTEXT_FULL
#error "DL_STATUS_CONTEXT_FULL is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_STATUS_KV_CAPACITY
#error "DL_STATUS_KV_CAPACITY is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_STATUS_MASK_CAPACITY
#error "DL_STATUS_MASK_CAPACITY is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_STATUS_NONFINITE
#error "DL_STATUS_NONFINITE is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_FINISH_DONE
#error "DL_FINISH_DONE is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_FINISH_NONFINITE
#error "DL_FINISH_NONFINITE is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_RECORD_HEADER
#error "DL_RECORD_HEADER is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_RING_HEADER
#error "DL_RING_HEADER is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_MAX_DEPTH
#error "DL_MAX_DEPTH is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_MAX_BUDGET
#error "DL_MAX_BUDGET is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_MAX_BATCH
#error "DL_MAX_BATCH is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_FLAG_LEGACY_SEARCH
#error "DL_FLAG_LEGACY_SEARCH is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TOPK_THREADS
#error "DL_DDTREE_TOPK_THREADS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TOPK_ELEMS
#error "DL_DDTREE_TOPK_ELEMS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_BUILD_THREADS
#error "DL_DDTREE_BUILD_THREADS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_MERGE_ELEMS
#error "DL_DDTREE_MERGE_ELEMS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_FALLBACK_SHARED_BYTES
#error "DL_DDTREE_FALLBACK_SHARED_BYTES is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TK_SAMPLE_VALUES
#error "DL_DDTREE_TK_SAMPLE_VALUES is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TK_STREAM_THREADS
#error "DL_DDTREE_TK_STREAM_THREADS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TK_STREAM_VECS
#error "DL_DDTREE_TK_STREAM_VECS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TK_STREAM_CTAS_PER_SM
#error "DL_DDTREE_TK_STREAM_CTAS_PER_SM is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_TK_WARP_STAGE
#error "DL_DDTREE_TK_WARP_STAGE is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
#ifndef DL_DDTREE_SMALL_THREADS
#error "DL_DDTREE_SMALL_THREADS is not defined: compile with driverlevel.ddtree.compile_variants() (ddtree.cu) or driverlevel.runner.compile_variants() (runner.cu)"
#endif
