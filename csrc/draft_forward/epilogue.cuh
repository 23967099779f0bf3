// Epilogue pieces shared by the fused GEMV and the batched (cuBLAS) path: RoPE + KV-cache writes,
// SiLU, and per-tile top-k / log-sum-exp of the logits.
#pragma once

#include <cfloat>
#include <climits>

#include "draft_forward/common.cuh"
#include "draft_forward/kernels.cuh"

// libdevice's accurate functions: the ones PyTorch's own CUDA kernels compile to. The extension is
// built with --use_fast_math, under which cosf/sinf/expf become approximate intrinsics; RoPE angles
// reach thousands of radians, where those would not match the reference.
extern "C" __device__ float __nv_cosf(float);
extern "C" __device__ float __nv_sinf(float);
extern "C" __device__ float __nv_expf(float);
extern "C" __device__ double __nv_log(double);

namespace drafter_lab::draft_forward::cuda {

// cos/sin of model.py's rope_cos_sin for element e < head_dim / 2, computed as PyTorch does:
// angle = float(position) * inv[e] in fp32 (inv as the reference made it), cos/sin in fp32.
__device__ __forceinline__ void rope_cos_sin(int64_t position, int e, const float* inv, float& c, float& s) {
  const float angle = __fmul_rn(static_cast<float>(position), __ldg(inv + e));
  c = __nv_cosf(angle);
  s = __nv_sinf(angle);
}

// Stores elements e and e + head_dim/2 of head `head` of this step's [q | k | v] heads for row b:
// RoPE (rotate_half) on q and k with every product rounded to T as in the reference; k and v go
// into the caches at cache_lens[b] (nothing is written when that index is outside the cache).
template <typename T>
__device__ __forceinline__ void store_qkv(const QkvOut& o, int b, int head, int e, float x1, float x2) {
  const int d = o.head_dim, half = d / 2;
  if (head < o.n_heads + o.n_kv) {
    float c, s;
    rope_cos_sin(load_index(o.positions, o.positions64, b), e, o.rope_inv_freq, c, s);
    c = rnd<T>(c);
    s = rnd<T>(s);
    const float y1 = rnd<T>(__fadd_rn(rnd<T>(__fmul_rn(x1, c)), rnd<T>(__fmul_rn(-x2, s))));
    const float y2 = rnd<T>(__fadd_rn(rnd<T>(__fmul_rn(x2, c)), rnd<T>(__fmul_rn(x1, s))));
    x1 = y1;
    x2 = y2;
  }
  T* dst;
  if (head < o.n_heads) {
    dst = static_cast<T*>(o.q_out) + (static_cast<int64_t>(b) * o.n_heads + head) * d;
  } else {
    const int64_t len = load_index(o.cache_lens, o.lens64, b);
    if (len < 0 || len >= o.cache_size) return;
    const bool is_k = head < o.n_heads + o.n_kv;
    const int kvh = head - o.n_heads - (is_k ? 0 : o.n_kv);
    dst = static_cast<T*>(is_k ? o.k_cache : o.v_cache) +
          ((static_cast<int64_t>(b) * o.n_kv + kvh) * o.cache_size + len) * d;
  }
  dst[e] = from_f<T>(x1);
  dst[e + half] = from_f<T>(x2);
}

// silu(g) * u with g, u already rounded to T; silu as PyTorch computes it, x / (1 + exp(-x)).
template <typename T>
__device__ __forceinline__ float silu_mul(float g, float u) {
  const float sg = rnd<T>(__fdiv_rn(g, __fadd_rn(1.0f, __nv_expf(-g))));
  return rnd<T>(__fmul_rn(sg, u));
}

// One warp, one logits row b, one tile of 32 vocab rows: lane i holds logit v of vocab row `row`
// (valid = inside the vocab). Writes the tile's max, sum of exp(v - max) and top-k candidates.
__device__ __forceinline__ void warp_tile_topk(const TopkParts& t, int tile, int b, int batch, float v, int row,
                                               bool valid) {
  const int lane = threadIdx.x & 31;
  const float m = warp_max(valid ? v : -FLT_MAX);
  const float sum = warp_sum(valid ? __expf(v - m) : 0.0f);
  const int64_t slot = static_cast<int64_t>(tile) * batch + b;
  if (lane == 0) {
    t.tile_max[slot] = m;
    t.tile_sum[slot] = sum;
  }
  // NaN (a row whose step overflowed) offers itself as -inf: `better` never takes a NaN, so such a row
  // found no candidate and wrote id -1, which the next step's embedding lookup read out of bounds.
  float mine = valid && !isnan(v) ? v : -INFINITY;
  int my_idx = valid ? row : INT_MAX;  // INT_MAX: nothing (left) to offer
  for (int r = 0; r < t.topk; ++r) {
    float bv = mine;
    int bi = my_idx;
    warp_best(bv, bi);
    if (lane == 0) {
      t.cand_val[slot * t.topk + r] = bv;
      t.cand_idx[slot * t.topk + r] = bi == INT_MAX ? -1 : bi;
    }
    if (bi == my_idx) {
      mine = -INFINITY;
      my_idx = INT_MAX;
    }
  }
}

}  // namespace drafter_lab::draft_forward::cuda
