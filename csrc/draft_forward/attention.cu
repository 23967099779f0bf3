// Decode attention over the drafter's KV cache, split over the cache length.
//
// Block (split, kv head, row): keys split*chunk .. +chunk (capped at cache_lens[b] + 1), all query
// heads of the kv head (GQA reads each K/V row once). Scores are rounded to T twice, as the
// reference's q @ k^T and * scale are; softmax pieces in fp32; p @ v accumulated in fp32. The last
// block of a (row, kv head) to finish merges the splits (log-sum-exp rescaling) and stores T.
//
// A block is a few dependent steps, so its time is load latency, not bandwidth: each thread issues
// kU rows of K and of V at once (one tile), and the first tile's rows older than this step's entry
// are requested before waiting for the qkv GEMV that writes q and that entry (pdl.cuh). At batch 1
// and context 1024 a block's keys are one tile: one round trip for all of its K and V.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "draft_forward/common.cuh"
#include "draft_forward/epilogue.cuh"
#include "draft_forward/kernels.cuh"
#include "draft_forward/pdl.cuh"

namespace drafter_lab::draft_forward::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadBlock = 4;  // query heads accumulated together in p @ v
constexpr int kMaxChunk = 1024;
constexpr int kU = 8;  // K (and V) rows a thread has in flight: 2 x 8 x 16 bytes of registers

template <typename T, int D>
struct Layout {
  static constexpr int kVec = Dt<T>::kVec;
  static constexpr int kLanes = D / kVec;          // lanes that share one key row
  static constexpr int kPerWarp = 32 / kLanes;     // keys a warp handles at once
  static constexpr int kGroups = kWarps * kPerWarp;
  static constexpr int kTile = kGroups * kU;       // keys a block loads at once
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_kernel(const __grid_constant__ AttnParams p) {
  using L = Layout<T, D>;
  constexpr int V = L::kVec, G = L::kLanes;
  extern __shared__ __align__(16) float sm[];
  __shared__ bool last;
  const int rep = p.n_heads / p.n_kv;
  float* qs = sm;                                // [rep][D]: q, then this block's p @ v
  float* sc = qs + rep * D;                      // [rep][chunk]: scores, then exp(score - m)
  float* red = sc + rep * p.chunk;               // [groups][kHeadBlock][D]
  float* ml = red + L::kGroups * kHeadBlock * D;  // [rep][2]: max, sum

  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head0 = kvh * rep;
  const int64_t row_off = static_cast<int64_t>(b) * p.n_heads * D + static_cast<int64_t>(head0) * D;
  T* out = static_cast<T*>(p.out) + row_off;
  // cache_lens is an input of the op, written before any of its kernels ran.
  const int64_t len = load_index(p.cache_lens, p.lens64, b);
  const bool bad = len < 0 || len >= p.cache_size;  // no host sync to raise: the row becomes NaN
  const int s0 = split * p.chunk;
  const int nk = bad ? 0 : max(0, min(p.chunk, static_cast<int>(len) + 1 - s0));
  const int fresh = bad ? -1 : static_cast<int>(len) - s0;  // this step's entry, block-local

  const int64_t cache_row = (static_cast<int64_t>(b) * p.n_kv + kvh) * p.cache_size + s0;
  const T* kc = static_cast<const T*>(p.k_cache) + cache_row * D;
  const T* vc = static_cast<const T*>(p.v_cache) + cache_row * D;
  const int sub = lane / G, gl = lane % G;
  const int gid = warp * L::kPerWarp + sub;
  // Rows before this step's entry were written by earlier steps and are streamed; the first tile's
  // go out before the wait. The entry itself is the qkv GEMV's output: a coherent load (__ldcg is
  // volatile asm, so it stays after the wait).
  auto row_at = [&](const T* cache, int j) { return cache + static_cast<int64_t>(j) * D + gl * V; };
  auto load = [&](const T* cache, int j) {
    return j == fresh ? __ldcg(reinterpret_cast<const uint4*>(row_at(cache, j))) : ld_stream(row_at(cache, j));
  };
  // A tile: rows j = base + u * kGroups + gid, all loads issued before any is used.
  auto load_tile = [&](const T* cache, int base, uint4(&regs)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = base + u * L::kGroups + gid;
      if (j < nk) regs[u] = load(cache, j);
    }
  };

  // The first tile, all but this step's entry before the wait.
  uint4 kr[kU], vr[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int j = u * L::kGroups + gid;
    kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
    if (j < nk && j != fresh) {
      kr[u] = ld_stream_before_wait(row_at(kc, j));
      vr[u] = ld_stream_before_wait(row_at(vc, j));
    }
  }
  pdl_wait();
  pdl_trigger();
  if (bad) {
    if (split == 0) {
      for (int i = tid; i < rep * D; i += kThreads) out[i] = from_f<T>(NAN);
    }
    return;
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u * L::kGroups + gid == fresh && fresh < nk) {
      kr[u] = load(kc, fresh);
      vr[u] = load(vc, fresh);
    }
  }
  const T* q = static_cast<const T*>(p.q) + row_off;
  for (int i = tid; i < rep * D; i += kThreads) qs[i] = to_f(q[i]);
  __syncthreads();

  // Scores: G lanes per key, each holding V elements of the row; a tile's K rows loaded together.
  for (int base = 0; base < nk; base += L::kTile) {
    if (base > 0) load_tile(kc, base, kr);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int jw = base + u * L::kGroups + warp * L::kPerWarp;  // the warp's first key: uniform
      if (jw >= nk) break;
      const int j = jw + sub;
      const bool ok = j < nk;
      float kf[V];
      unpack<T>(kr[u], kf);
      for (int r = 0; r < rep; ++r) {
        const float* qr = qs + r * D + gl * V;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < V; ++e) d = fmaf(qr[e], kf[e], d);
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (ok && gl == 0) sc[r * p.chunk + j] = rnd<T>(__fmul_rn(rnd<T>(d), p.scale));
      }
    }
  }
  __syncthreads();

  // Softmax pieces per head over this block's keys.
  for (int r = warp; r < rep; r += kWarps) {
    float* s = sc + r * p.chunk;
    float m = -INFINITY;
    for (int j = lane; j < nk; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < nk; j += 32) {
      const float e = __nv_expf(s[j] - m);
      s[j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ml[2 * r] = m;
      ml[2 * r + 1] = l;
    }
  }
  __syncthreads();

  // p @ v, kHeadBlock heads at a time, a tile of V rows at a time (the first is still in vr); each
  // group sums its keys, then the groups are added in order.
  for (int r0 = 0; r0 < rep; r0 += kHeadBlock) {
    float acc[kHeadBlock][V] = {};
    for (int base = 0; base < nk; base += L::kTile) {
      if (r0 > 0 || base > 0) load_tile(vc, base, vr);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int j = base + u * L::kGroups + gid;
        if (j < nk) {
          float vf[V];
          unpack<T>(vr[u], vf);
#pragma unroll
          for (int h = 0; h < kHeadBlock; ++h) {
            if (r0 + h < rep) {
              const float pj = sc[(r0 + h) * p.chunk + j];
#pragma unroll
              for (int e = 0; e < V; ++e) acc[h][e] = fmaf(pj, vf[e], acc[h][e]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kHeadBlock; ++h) {
#pragma unroll
      for (int e = 0; e < V; ++e) red[(gid * kHeadBlock + h) * D + gl * V + e] = acc[h][e];
    }
    __syncthreads();
    for (int i = tid; i < kHeadBlock * D; i += kThreads) {
      const int h = i / D, e = i % D;
      if (r0 + h < rep) {
        float o = 0.0f;
        for (int g = 0; g < L::kGroups; ++g) o += red[(g * kHeadBlock + h) * D + e];
        qs[(r0 + h) * D + e] = o;
      }
    }
    __syncthreads();
  }

  if (p.n_split == 1) {
    for (int i = tid; i < rep * D; i += kThreads) out[i] = from_f<T>(qs[i] / ml[2 * (i / D) + 1]);
    return;
  }
  const int64_t hb = static_cast<int64_t>(b) * p.n_heads + head0;
  for (int i = tid; i < rep * D; i += kThreads) {
    p.part_o[((hb + i / D) * p.n_split + split) * D + i % D] = qs[i];
  }
  for (int r = tid; r < rep; r += kThreads) {
    p.part_ml[((hb + r) * p.n_split + split) * 2] = ml[2 * r];
    p.part_ml[((hb + r) * p.n_split + split) * 2 + 1] = ml[2 * r + 1];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&p.counters[b * p.n_kv + kvh], 1) == p.n_split - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Merge: one warp per head turns the splits' (max, sum) into weights exp(m_s - M) in shared
  // memory (sc; the plan keeps n_split <= chunk) and their total; then every output element sums
  // its splits with independent loads in flight.
  for (int r = warp; r < rep; r += kWarps) {
    const float* mlh = p.part_ml + (hb + r) * p.n_split * 2;
    float M = -INFINITY;
    for (int s = lane; s < p.n_split; s += 32) M = fmaxf(M, __ldcg(mlh + 2 * s));
    M = warp_max(M);
    float l = 0.0f;
    for (int s = lane; s < p.n_split; s += 32) {
      const float w = __nv_expf(__ldcg(mlh + 2 * s) - M);
      sc[r * p.chunk + s] = w;
      l += w * __ldcg(mlh + 2 * s + 1);
    }
    l = warp_sum(l);
    if (lane == 0) ml[2 * r + 1] = l;
  }
  __syncthreads();
  for (int i = tid; i < rep * D; i += kThreads) {
    const int r = i / D;
    const float* w = sc + r * p.chunk;
    const float* po = p.part_o + (hb + r) * p.n_split * D + i % D;
    float O = 0.0f;
#pragma unroll 8
    for (int s = 0; s < p.n_split; ++s) O += w[s] * __ldcg(po + static_cast<int64_t>(s) * D);
    out[i] = from_f<T>(O / ml[2 * r + 1]);
  }
}

template <typename T, int D>
int smem_fixed(int rep) {
  using L = Layout<T, D>;
  return (rep * D + L::kGroups * kHeadBlock * D + 2 * rep) * static_cast<int>(sizeof(float));
}

template <typename T>
int smem_fixed_for(int head_dim, int rep) {
  return head_dim == 64 ? smem_fixed<T, 64>(rep) : smem_fixed<T, 128>(rep);
}

int fixed_bytes(c10::ScalarType dtype, int head_dim, int rep) {
  switch (dtype) {
    case c10::kBFloat16:
      return smem_fixed_for<__nv_bfloat16>(head_dim, rep);
    case c10::kHalf:
      return smem_fixed_for<__half>(head_dim, rep);
    default:
      return smem_fixed_for<float>(head_dim, rep);
  }
}

template <typename T, int D>
void launch_typed(const AttnParams& p, int smem, cudaStream_t stream) {
  if (smem > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  launch_pdl(attention_kernel<T, D>, dim3(p.n_split, p.n_kv, p.batch), dim3(kThreads), smem, stream, p);
}

template <typename T>
void launch_dim(const AttnParams& p, int smem, cudaStream_t stream) {
  if (p.head_dim == 64) {
    launch_typed<T, 64>(p, smem, stream);
  } else {
    launch_typed<T, 128>(p, smem, stream);
  }
}

}  // namespace

int plan_attention(AttnParams& p, c10::ScalarType dtype, int sm_count, int smem_optin) {
  const int rep = p.n_heads / p.n_kv;
  const int fixed = fixed_bytes(dtype, p.head_dim, rep);
  const int room = smem_optin - 1024 - fixed;  // 1 KiB for static shared memory
  const int max_chunk = std::min(kMaxChunk, room / (rep * 4) / 32 * 32);
  TORCH_CHECK(max_chunk >= 32, "draft_step: ", rep, " query heads per kv head at head_dim ", p.head_dim,
              " need more shared memory than the device has");
  // About two blocks per SM (the key loops are latency-bound: fewer, longer splits measured slower
  // at batch 8 and 32 on an H200); chunks of at least 64 and at least sqrt(cache) keys, so that the
  // merge stays short and its per-split weights fit in the score buffer (n_split <= chunk).
  const int64_t blocks = static_cast<int64_t>(p.batch) * p.n_kv;
  const int64_t want = std::max<int64_t>(1, (2 * static_cast<int64_t>(sm_count) + blocks - 1) / blocks);
  const int floor_chunk = std::max(64, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(p.cache_size)))));
  int chunk = std::max(static_cast<int>((p.cache_size + want - 1) / want), floor_chunk);
  chunk = std::min((chunk + 31) / 32 * 32, max_chunk);
  TORCH_CHECK((p.cache_size + chunk - 1) / chunk <= chunk, "draft_step: a KV cache of ", p.cache_size,
              " entries needs more shared memory than the device has");
  p.chunk = chunk;
  p.n_split = (p.cache_size + chunk - 1) / chunk;
  return fixed + rep * chunk * 4;
}

void launch_attention(const AttnParams& p, c10::ScalarType dtype, int smem, cudaStream_t stream) {
  switch (dtype) {
    case c10::kBFloat16:
      return launch_dim<__nv_bfloat16>(p, smem, stream);
    case c10::kHalf:
      return launch_dim<__half>(p, smem, stream);
    default:
      return launch_dim<float>(p, smem, stream);
  }
}

}  // namespace drafter_lab::draft_forward::cuda
