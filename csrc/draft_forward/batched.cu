// Kernels around cuBLAS for batches above kMaxGemvBatch (the GEMMs themselves are at::linear),
// and the top-k merge both paths finish with.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include "draft_forward/common.cuh"
#include "draft_forward/epilogue.cuh"
#include "draft_forward/kernels.cuh"
#include "draft_forward/pdl.cuh"

extern "C" __device__ float __nv_logf(float);

namespace drafter_lab::draft_forward::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The top-k merge is one block per row and latency-bound: more threads, fewer dependent loads each.
constexpr int kMergeThreads = 512;
constexpr int kMergeWarps = kMergeThreads / 32;

template <int NW = kWarps>
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < NW; ++w) t += scratch[w];
  return t;
}

template <int NW = kWarps>
__device__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < NW; ++w) t = fmaxf(t, scratch[w]);
  return t;
}

// RMSNorm of one row, rounded like model.py: w * T(x * rsqrt(mean(x^2) + eps)).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const T* x, const T* w, T* out, int hidden, int out_ld, int offset, float eps) {
  __shared__ float scratch[kWarps];
  const int b = blockIdx.x;
  const T* xr = x + static_cast<int64_t>(b) * hidden;
  float s = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    const float v = to_f(xr[i]);
    s = fmaf(v, v, s);
  }
  const float rstd = rsqrtf(block_sum(s, scratch) / static_cast<float>(hidden) + eps);
  T* o = out + static_cast<int64_t>(b) * out_ld + offset;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    o[i] = from_f<T>(__fmul_rn(to_f(w[i]), rnd<T>(__fmul_rn(to_f(xr[i]), rstd))));
  }
}

// One thread per (row, head of [q | k | v], element pair).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_cache_kernel(const T* q, const T* k, const T* v, const QkvOut o, int batch) {
  const int half = o.head_dim / 2, heads = o.n_heads + 2 * o.n_kv;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(batch) * heads * half) return;
  const int e = static_cast<int>(i % half);
  const int head = static_cast<int>((i / half) % heads);
  const int b = static_cast<int>(i / (static_cast<int64_t>(half) * heads));
  const T* src;
  if (head < o.n_heads) {
    src = q + (static_cast<int64_t>(b) * o.n_heads + head) * o.head_dim;
  } else if (head < o.n_heads + o.n_kv) {
    src = k + (static_cast<int64_t>(b) * o.n_kv + head - o.n_heads) * o.head_dim;
  } else {
    src = v + (static_cast<int64_t>(b) * o.n_kv + head - o.n_heads - o.n_kv) * o.head_dim;
  }
  store_qkv<T>(o, b, head, e, to_f(src[e]), to_f(src[e + half]));
}

// Warp w of block x handles vocab tile 8x + w of logits row blockIdx.y.
template <typename T>
__global__ void __launch_bounds__(kThreads) logits_parts_kernel(const T* logits, int batch, int vocab, const TopkParts t) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tile = blockIdx.x * kWarps + warp, b = blockIdx.y;
  if (tile >= t.n_tiles) return;
  const int row = tile * kTileRows + lane;
  const bool valid = row < vocab;
  const float v = valid ? to_f(logits[static_cast<int64_t>(b) * vocab + row]) : 0.0f;
  warp_tile_topk(t, tile, b, batch, v, row, valid);
}

// Row b, one pass over its tiles: each thread folds its tiles' log-sum-exp pieces into a running
// (max, sum) and keeps its best K candidates in registers (unrolled insertion; a tile's candidates
// come best first, so the first that misses ends the tile). Then k rounds of a block-wide best pop
// the winner's head, and the k winners' d2t loads go out together. K >= topk is the list length.
template <int K>
__global__ void __launch_bounds__(kMergeThreads)
    topk_merge_kernel(const TopkParts t, int batch, const int64_t* d2t, int64_t* ids, float* logp) {
  __shared__ float scratch[kMergeWarps];
  __shared__ float best_v[kMergeWarps];
  __shared__ int best_i[kMergeWarps];
  __shared__ float won_v[K];
  __shared__ int won_i[K];
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  pdl_wait();

  float m = -INFINITY, s = 0.0f;
  float lv[K];
  int li[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    lv[j] = -INFINITY;
    li[j] = INT_MAX;
  }
  // kAhead tiles at a time, every load issued before any is used: the folding and insertions
  // branch on the values, and the compiler does not hoist loads above those branches by itself.
  constexpr int kAhead = K <= 8 ? 2 : 1;  // 2 x (2 + 2K) registers of loads; top-16 lists take 32
  for (int i0 = tid; i0 < t.n_tiles; i0 += kAhead * kMergeThreads) {
    float tm[kAhead], ts[kAhead], cv[kAhead][K];
    int ci[kAhead][K];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int i = i0 + a * kMergeThreads;
      const int64_t slot = static_cast<int64_t>(i) * batch + b;
      const bool here = i < t.n_tiles;
      tm[a] = here ? t.tile_max[slot] : 0.0f;
      ts[a] = here ? t.tile_sum[slot] : 0.0f;
#pragma unroll
      for (int r = 0; r < K; ++r) {
        const bool c = here && r < t.topk;
        cv[a][r] = c ? t.cand_val[slot * t.topk + r] : -INFINITY;
        ci[a][r] = c ? t.cand_idx[slot * t.topk + r] : -1;
      }
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      if (i0 + a * kMergeThreads >= t.n_tiles) break;
      if (tm[a] > m) {
        s = s * __nv_expf(m - tm[a]) + ts[a];
        m = tm[a];
      } else {
        s += ts[a] * __nv_expf(tm[a] - m);
      }
#pragma unroll
      for (int r = 0; r < K; ++r) {
        float v = cv[a][r];
        int idx = ci[a][r];
        if (idx < 0 || !better(v, idx, lv[K - 1], li[K - 1])) break;
#pragma unroll
        for (int j = 0; j < K; ++j) {
          if (better(v, idx, lv[j], li[j])) {
            const float tv = lv[j];
            const int ti = li[j];
            lv[j] = v;
            li[j] = idx;
            v = tv;
            idx = ti;
          }
        }
      }
    }
  }
  const float row_max = block_max<kMergeWarps>(m, scratch);
  const float log_sum = __nv_logf(block_sum<kMergeWarps>(s * __nv_expf(m - row_max), scratch));

  for (int r = 0; r < t.topk; ++r) {
    float bv = lv[0];
    int bi = li[0];
    warp_best(bv, bi);
    __syncthreads();
    if (lane == 0) {
      best_v[warp] = bv;
      best_i[warp] = bi;
    }
    __syncthreads();
    bv = best_v[0];
    bi = best_i[0];
    for (int w = 1; w < kMergeWarps; ++w) {
      if (better(best_v[w], best_i[w], bv, bi)) {
        bv = best_v[w];
        bi = best_i[w];
      }
    }
    if (li[0] == bi && bi != INT_MAX) {  // the winner pops its head
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) {
        lv[j] = lv[j + 1];
        li[j] = li[j + 1];
      }
      lv[K - 1] = -INFINITY;
      li[K - 1] = INT_MAX;
    }
    if (tid == 0) {
      won_v[r] = bv;
      won_i[r] = bi;
    }
  }
  __syncthreads();
  if (tid < t.topk) {
    const int64_t o = static_cast<int64_t>(b) * t.topk + tid;
    const int bi = won_i[tid];
    const bool found = bi != INT_MAX;
    ids[o] = found ? bi + d2t[bi] : -1;
    logp[o] = found ? __fsub_rn(__fsub_rn(won_v[tid], row_max), log_sum) : NAN;
  }
}

template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}

}  // namespace

void launch_rms_norm(const void* x, const void* w, void* out, int batch, int hidden, int out_ld, int offset,
                     float eps, c10::ScalarType dtype, cudaStream_t stream) {
  switch (dtype) {
    case c10::kBFloat16:
      rms_norm_kernel<__nv_bfloat16><<<batch, kThreads, 0, stream>>>(
          as<__nv_bfloat16>(x), as<__nv_bfloat16>(w), static_cast<__nv_bfloat16*>(out), hidden, out_ld, offset, eps);
      break;
    case c10::kHalf:
      rms_norm_kernel<__half><<<batch, kThreads, 0, stream>>>(as<__half>(x), as<__half>(w), static_cast<__half*>(out),
                                                              hidden, out_ld, offset, eps);
      break;
    default:
      rms_norm_kernel<float><<<batch, kThreads, 0, stream>>>(as<float>(x), as<float>(w), static_cast<float*>(out),
                                                             hidden, out_ld, offset, eps);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_rope_cache(const void* q, const void* k, const void* v, const QkvOut& o, int batch,
                       c10::ScalarType dtype, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(batch) * (o.n_heads + 2 * o.n_kv) * (o.head_dim / 2);
  const int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  switch (dtype) {
    case c10::kBFloat16:
      rope_cache_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          as<__nv_bfloat16>(q), as<__nv_bfloat16>(k), as<__nv_bfloat16>(v), o, batch);
      break;
    case c10::kHalf:
      rope_cache_kernel<__half><<<blocks, kThreads, 0, stream>>>(as<__half>(q), as<__half>(k), as<__half>(v), o, batch);
      break;
    default:
      rope_cache_kernel<float><<<blocks, kThreads, 0, stream>>>(as<float>(q), as<float>(k), as<float>(v), o, batch);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_logits_parts(const void* logits, int batch, int vocab, const TopkParts& t, c10::ScalarType dtype,
                         cudaStream_t stream) {
  const dim3 grid((t.n_tiles + kWarps - 1) / kWarps, batch);
  switch (dtype) {
    case c10::kBFloat16:
      logits_parts_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(as<__nv_bfloat16>(logits), batch, vocab, t);
      break;
    case c10::kHalf:
      logits_parts_kernel<__half><<<grid, kThreads, 0, stream>>>(as<__half>(logits), batch, vocab, t);
      break;
    default:
      logits_parts_kernel<float><<<grid, kThreads, 0, stream>>>(as<float>(logits), batch, vocab, t);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_topk_merge(const TopkParts& t, int batch, const int64_t* d2t, int64_t* ids, float* logp,
                       cudaStream_t stream) {
  TORCH_CHECK(t.topk >= 1 && t.topk <= kMaxTopk, "draft_step: topk ", t.topk, " > ", kMaxTopk, " on CUDA");
  static_assert(kMaxTopk == 16, "the list lengths below end at kMaxTopk");
  auto* kernel = t.topk <= 4 ? topk_merge_kernel<4> : t.topk <= 8 ? topk_merge_kernel<8> : topk_merge_kernel<16>;
  launch_pdl(kernel, dim3(batch), dim3(kMergeThreads), 0, stream, t, batch, d2t, ids, logp);
}

}  // namespace drafter_lab::draft_forward::cuda
