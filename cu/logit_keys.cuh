// logit_keys.cuh: order keys of logits, (key, id) composites, logit loads, and the package's one
// argmax rule. Shared by the argmax kernel (argmax.cu), its consumers (ddtree_accept in
// ddtree/accept.cuh, ar_commit in runner.cu) and the DDTree top-K (ddtree/keys.cuh takes these
// into namespace ddt).
//
// The rule of every top-K and argmax of the package: NaN counts as -inf, equal values go to the
// lower id, ids are always in [0, vocab), and a row with nothing above -inf is "not finite".
// An argmax is the row's largest composite (order key << 32 | ~id); 0 means "no candidate":
// argmax_token(0) = 0 and argmax_finite(0) = false.
#pragma once
#include "common.cuh"

namespace dl {

// Order-preserving u32 of a float: larger float -> larger key; -0 and +0 map alike.
DL_DEVICE u32 f32_key(float x) {
  u32 b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
DL_DEVICE float key_f32(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }
// NaN counts as -inf (ids stay in range and distinct; a row with nothing above -inf is "not
// finite"). The key of a loaded logit:
constexpr u32 KEY_NEG_INF = 0x007fffffu;  // f32_key(-inf): the smallest key a logit can have (never 0)
DL_DEVICE u32 logit_key(float x) {
  const u32 b = __float_as_uint(x);
  return (b & 0x7fffffffu) > 0x7f800000u ? KEY_NEG_INF : f32_key(x);
}

// (key, id) as one 64-bit value: larger logit first, then lower id. 0 = no candidate.
DL_DEVICE u64 composite(u32 key, int id) { return (static_cast<u64>(key) << 32) | static_cast<u32>(~id); }
DL_DEVICE int composite_id(u64 c) { return static_cast<int>(~static_cast<u32>(c)); }

// The argmax of a row from its largest composite (argmax.cu writes it): the token (0 for a row
// with nothing above -inf, so ids stay in [0, vocab)) and whether the row had a finite argmax.
DL_DEVICE bool argmax_finite(u64 c) { return c != 0ull; }
DL_DEVICE int argmax_token(u64 c) { return c ? composite_id(c) : 0; }

template <typename T> struct LogitTraits;
template <> struct LogitTraits<float> {
  static constexpr int VEC = 4;
  DL_DEVICE static void load_vec(const float* p, float (&v)[4]) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  }
  DL_DEVICE static float load(const float* p) { return *p; }
};
template <> struct LogitTraits<bf16> {
  static constexpr int VEC = 8;
  DL_DEVICE static void load_vec(const bf16* p, float (&v)[8]) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) unpack_bf16x2(w[i], v[2 * i], v[2 * i + 1]);
  }
  DL_DEVICE static float load(const bf16* p) { return __bfloat162float(*p); }
};

}  // namespace dl
