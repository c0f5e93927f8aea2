"""Host references of what the kernels compute: numpy (float64 where it matters), no GPU needed.

The tests compare every kernel's output against these; they are public so that a caller can check
its own data the same way. Import the module you need:

- :mod:`driverlevel.reference.attention`: the verify attention for MLA draft trees in float64
  (``verify_attention_reference``) and a brute-force twin (``verify_attention_bruteforce``);
- :mod:`driverlevel.reference.ddtree`: DDTree's tree build (top-K log-probs, best-first search),
  tree compile, greedy accept and KV commit (Ringel & Romano 2026, arXiv 2604.12989);
- :mod:`driverlevel.reference.topk_threshold`: the threshold top-K kernels' twin, value for value;
- :mod:`driverlevel.reference.trees`: draft trees as parents arrays and their verify metadata
  (``qo_indptr``, ``kv_indptr``, ``kv_indices``, masks);
- :mod:`driverlevel.reference.verify_schedule`: the verify attention's device-side schedule, the
  same arithmetic as ``verify_attn_schedule``.
"""
