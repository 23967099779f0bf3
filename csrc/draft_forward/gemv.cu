// Split-K GEMV for decode batches (B <= 16) with fused RMSNorm prologue and per-layer epilogues.
//
// A block owns a tile of 32 output rows and one K slice. It stages x[:, slice] (times the RMSNorm
// weight for norm inputs) in shared memory and accumulates its sum of squares, then streams the
// weight rows with 16-byte loads that skip L1. bf16/fp16 use tensor cores (mma m16n8k16, fp32
// accumulation): a thread's two 16-byte loads of a weight row are its A fragment under a fixed
// permutation of k, and the matching x bytes its B fragment, so no shuffle or shared-memory
// staging of weights is needed. fp32 uses CUDA-core FMAs. The last block of a tile to finish
// (atomic counter, zeroed per call) sums the slices in a fixed order, applies 1/rms, and runs the
// epilogue; results are deterministic.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

#include "draft_forward/common.cuh"
#include "draft_forward/epilogue.cuh"
#include "draft_forward/kernels.cuh"
#include "draft_forward/pdl.cuh"

namespace drafter_lab::draft_forward::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSmemBudget = 32 * 1024;  // x slice per block: leaves room for several blocks per SM
constexpr int kMinSlice = 512;          // columns per block below which splitting K stops paying
constexpr int kBlocksPerSm = 4;         // resident blocks per SM (64 registers x 256 threads)

// Virtual row of local row i (0..31) of a tile; paired tiles hold rows r and r + pair in halves.
__device__ __forceinline__ int tile_row(const GemvParams& p, int tile, int i) {
  if (p.pair == 0) return tile * kTileRows + i;
  const int per = p.pair / 16;
  const int g = tile / per, j = tile - g * per;
  return g * 2 * p.pair + j * 16 + (i < 16 ? i : p.pair + i - 16);
}

template <typename T>
__device__ __forceinline__ const T* weight_row(const GemvParams& p, int row) {
  int s = 0;
  while (s + 1 < p.n_wseg && row >= p.row_begin[s + 1]) ++s;
  return static_cast<const T*>(p.w[s]) + static_cast<int64_t>(row - p.row_begin[s]) * p.K;
}

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Launched early (pdl.cuh): the weights do not depend on the kernel before, so each lane first pulls
// one 128-byte line of its rows' first two 64-column blocks (the tensor-core loop's mapping) into L2,
// then waits; everything that reads activations or writes memory comes after the wait.
template <typename T>
__device__ __forceinline__ void prefetch_then_wait(const GemvParams& p, int tile, int k_col, int len) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Dt<T>::kVec == 8) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row = min(tile_row(p, tile, (warp & 1) * 16 + g + (t & 1) * 8), p.rows - 1);
    const int blk = (warp >> 1) + (t >> 1) * 4;
    if (blk * 64 < len) asm volatile("prefetch.global.L2 [%0];" ::"l"(weight_row<T>(p, row) + k_col + blk * 64));
  }
#endif
  pdl_wait();
  pdl_trigger();
}

template <typename T, int NB>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const __grid_constant__ GemvParams p) {
  constexpr int V = Dt<T>::kVec;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kTileRows][NB];
  __shared__ float quarter[4][kTileRows][NB];
  __shared__ float ss_warp[kWarps][NB];
  __shared__ float ss[NB];
  __shared__ float rstd[2][NB];
  __shared__ bool last;

  const int tile = blockIdx.x, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int batch = p.batch;
  const int seg = split < p.n_split[0] ? 0 : 1;
  const int k_seg = (split - (seg ? p.n_split[0] : 0)) * p.slice[seg];
  const int len = min(p.slice[seg], p.x_len[seg] - k_seg);
  const int k_col = (seg ? p.x_len[0] : 0) + k_seg;
  const T* xg = static_cast<const T*>(p.x[seg]);
  const T* nw = static_cast<const T*>(p.norm_w[seg]);
  prefetch_then_wait<T>(p, tile, k_col, len);

  // Prologue: x[:, slice] (times the norm weight) -> shared memory, zero-padded to slice_pad.
  uint4* xs = reinterpret_cast<uint4*>(smem);
  const int nvec = p.slice_pad / V;
  float ssq[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    float s = 0.0f;
    if (b < batch) {
      for (int c = tid; c < nvec; c += kThreads) {
        uint4 v = make_uint4(0, 0, 0, 0);
        const int k = c * V;
        if (k < len) {
          v = ld_cached(xg + static_cast<int64_t>(b) * p.x_len[seg] + k_seg + k);
          if (nw != nullptr) {
            float f[V], g[V];
            unpack<T>(v, f);
            unpack<T>(ld_cached(nw + k_seg + k), g);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              s = fmaf(f[j], f[j], s);
              f[j] = __fmul_rn(f[j], g[j]);
            }
            v = pack<T>(f);
          }
        }
        xs[b * nvec + c] = v;
      }
    }
    ssq[b] = s;
  }
  if (nw != nullptr) {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float t = warp_sum(ssq[b]);
      if (lane == 0) ss_warp[warp][b] = t;
    }
  }
  __syncthreads();
  if (nw != nullptr && tid < NB) {
    float t = 0.0f;
    for (int w = 0; w < kWarps; ++w) t += ss_warp[w][tid];
    ss[tid] = t;
  }

  if constexpr (V == 8) {
    // Tensor cores. Warp w: rows (w & 1) * 16 .. +16 of the tile, k blocks of 64 taken round-robin
    // by the four warps of that row group. Lane (g, t): weight rows g and g + 8, k = 16t .. 16t+15
    // of the block, batch columns g (and g + 8 when NB = 16).
    constexpr int NT = NB / 8;
    const int g = lane >> 2, t = lane & 3;
    const int rg = warp & 1, q = warp >> 1;
    const int ra = min(tile_row(p, tile, rg * 16 + g), p.rows - 1);
    const int rb = min(tile_row(p, tile, rg * 16 + g + 8), p.rows - 1);
    const T* wa = weight_row<T>(p, ra) + k_col;
    const T* wb = weight_row<T>(p, rb) + k_col;
    float c[NT][4] = {};
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int nblk = p.slice_pad / 64;
#pragma unroll 2
    for (int it = q; it < nblk; it += 4) {
      const int k = it * 64 + t * 16;
      uint4 a0 = zero, a1 = zero, b0 = zero, b1 = zero;
      if (k < len) {
        a0 = ld_stream(wa + k);
        b0 = ld_stream(wb + k);
      }
      if (k + 8 < len) {
        a1 = ld_stream(wa + k + 8);
        b1 = ld_stream(wb + k + 8);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = nt * 8 + g;
        uint4 x0 = zero, x1 = zero;
        if (n < batch) {
          x0 = xs[n * nvec + k / 8];
          x1 = xs[n * nvec + k / 8 + 1];
        }
        mma<T>(c[nt], a0.x, b0.x, a0.y, b0.y, x0.x, x0.y);
        mma<T>(c[nt], a0.z, b0.z, a0.w, b0.w, x0.z, x0.w);
        mma<T>(c[nt], a1.x, b1.x, a1.y, b1.y, x1.x, x1.y);
        mma<T>(c[nt], a1.z, b1.z, a1.w, b1.w, x1.z, x1.w);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        quarter[q][rg * 16 + g][nt * 8 + 2 * t + j] = c[nt][j];
        quarter[q][rg * 16 + g + 8][nt * 8 + 2 * t + j] = c[nt][2 + j];
      }
    }
    __syncthreads();
    for (int e = tid; e < kTileRows * NB; e += kThreads) {
      const int i = e / NB, b = e % NB;
      red[i][b] = ((quarter[0][i][b] + quarter[1][i][b]) + quarter[2][i][b]) + quarter[3][i][b];
    }
  } else {
    // CUDA cores (fp32): warp w owns rows 4w .. 4w+3, lanes stride over 16-byte chunks of K.
    constexpr int R = kTileRows / kWarps;
    const T* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = weight_row<T>(p, min(tile_row(p, tile, warp * R + r), p.rows - 1)) + k_col;
    float acc[R][NB] = {};
    for (int c = lane; c * V < len; c += 32) {
      float wf[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack<T>(ld_stream(wr[r] + c * V), wf[r]);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (b < batch) {
          float xf[V];
          unpack<T>(xs[b * nvec + c], xf);
#pragma unroll
          for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int j = 0; j < V; ++j) acc[r][b] = fmaf(wf[r][j], xf[j], acc[r][b]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float v = warp_sum(acc[r][b]);
        if (lane == 0) red[warp * R + r][b] = v;
      }
    }
  }
  __syncthreads();

  // Combine the K slices: the last block of the tile to finish reduces them in split order.
  const int nseg = p.n_split[1] > 0 ? 2 : 1;
  if (p.total_splits > 1) {
    const int per_tile = kTileRows * batch;
    float* part = p.part + (static_cast<int64_t>(split) * p.n_tiles + tile) * per_tile;
    for (int e = tid; e < per_tile; e += kThreads) part[e] = red[e / batch][e % batch];
    if (tid < batch) {
      p.part_ss[(static_cast<int64_t>(tile) * p.total_splits + split) * batch + tid] = nw != nullptr ? ss[tid] : 0.0f;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&p.counters[tile], 1) == p.total_splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid < 2 * batch) {
      const int s = tid / batch, b = tid % batch;
      float r = 1.0f;
      if (s < nseg && p.norm_w[s] != nullptr) {
        const int first = s == 0 ? 0 : p.n_split[0];
        float sum = 0.0f;
        for (int j = first; j < first + p.n_split[s]; ++j) {
          sum += __ldcg(p.part_ss + (static_cast<int64_t>(tile) * p.total_splits + j) * batch + b);
        }
        r = rsqrtf(sum / static_cast<float>(p.x_len[s]) + p.eps);
      }
      rstd[s][b] = r;
    }
    __syncthreads();
    for (int e = tid; e < per_tile; e += kThreads) {
      float v = 0.0f;
      int j = 0;
      for (int s = 0; s < nseg; ++s) {
        float acc = 0.0f;
        for (int n = 0; n < p.n_split[s]; ++n, ++j) {
          acc += __ldcg(p.part + (static_cast<int64_t>(j) * p.n_tiles + tile) * per_tile + e);
        }
        v += acc * rstd[s][e % batch];
      }
      red[e / batch][e % batch] = v;
    }
    __syncthreads();
  } else if (nw != nullptr) {
    for (int e = tid; e < kTileRows * batch; e += kThreads) {
      const int i = e / batch, b = e % batch;
      red[i][b] *= rsqrtf(ss[b] / static_cast<float>(p.x_len[0]) + p.eps);
    }
    __syncthreads();
  }

  // Epilogue on the tile's fp32 sums; every stored value is rounded to T as the reference does.
  switch (p.epilogue) {
    case kStore:
    case kResidual: {
      T* out = static_cast<T*>(p.out);
      const T* res = static_cast<const T*>(p.residual);
      for (int e = tid; e < kTileRows * batch; e += kThreads) {
        const int i = e % kTileRows, b = e / kTileRows;
        const int row = tile_row(p, tile, i);
        if (row >= p.rows) continue;
        const int64_t at = static_cast<int64_t>(b) * p.rows + row;
        float y = rnd<T>(red[i][b]);
        if (p.epilogue == kResidual) y = __fadd_rn(to_f(res[at]), y);
        out[at] = from_f<T>(y);
      }
      break;
    }
    case kQkvRope:
      for (int e = tid; e < 16 * batch; e += kThreads) {
        const int i = e % 16, b = e / 16;
        const int row = tile_row(p, tile, i);
        store_qkv<T>(p.qkv, b, row / p.qkv.head_dim, row % p.qkv.head_dim, rnd<T>(red[i][b]),
                     rnd<T>(red[i + 16][b]));
      }
      break;
    case kSiluMul: {
      T* out = static_cast<T*>(p.out);
      for (int e = tid; e < 16 * batch; e += kThreads) {
        const int i = e % 16, b = e / 16;
        const int n = tile_row(p, tile, i);
        out[static_cast<int64_t>(b) * p.pair + n] = from_f<T>(silu_mul<T>(rnd<T>(red[i][b]), rnd<T>(red[i + 16][b])));
      }
      break;
    }
    case kLogits:
      for (int b = warp; b < batch; b += kWarps) {
        const int row = tile_row(p, tile, lane);
        const bool valid = row < p.rows;
        warp_tile_topk(p.topk, tile, b, batch, valid ? rnd<T>(red[lane][b]) : 0.0f, row, valid);
      }
      break;
    default:
      break;
  }
}

template <typename T, int NB>
void launch_typed(const GemvParams& p, cudaStream_t stream) {
  const int smem = p.batch * p.slice_pad * static_cast<int>(sizeof(T));
  TORCH_CHECK(smem <= 48 * 1024, "draft_step: GEMV slice of ", smem, " bytes exceeds shared memory");
  launch_pdl(gemv_kernel<T, NB>, dim3(p.n_tiles, p.total_splits), dim3(kThreads), smem, stream, p);
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Blocks per SM a plan fills. All four fill the register file, so the next kernel's blocks become
// resident, and prefetch, only in this one's tail; DRAFTER_LAB_GEMV_BLOCKS=1..3 leaves them room to
// launch early, at less streaming occupancy: an A/B for a GPU (device_check.sh), read once.
int blocks_per_sm() {
  static const int n = [] {
    const char* env = std::getenv("DRAFTER_LAB_GEMV_BLOCKS");
    const int v = env == nullptr ? 0 : std::atoi(env);
    return v >= 1 && v <= kBlocksPerSm ? v : kBlocksPerSm;
  }();
  return n;
}

int batch_tile(int batch, c10::ScalarType dtype) {
  if (dtype != c10::kFloat) return batch <= 8 ? 8 : 16;
  int nb = 1;
  while (nb < batch) nb *= 2;
  return nb;
}

}  // namespace

GemvWork plan_gemv(GemvParams& p, c10::ScalarType dtype, int sm_count) {
  TORCH_CHECK(p.batch >= 1 && p.batch <= kMaxGemvBatch, "draft_step: GEMV batch ", p.batch, " > ", kMaxGemvBatch);
  p.n_tiles = p.pair > 0 ? p.rows / kTileRows : ceil_div(p.rows, kTileRows);
  const int elem = static_cast<int>(c10::elementSize(dtype));
  const int max_slice = std::max(64, kSmemBudget / (p.batch * elem) / 64 * 64);
  // Round down: one more split than fits in a wave leaves a second, nearly empty wave.
  const int want = std::max(1, blocks_per_sm() * sm_count / p.n_tiles);
  int total = 0, widest = 0;
  for (int s = 0; s < 2; ++s) {
    const int len = p.x_len[s];
    if (len == 0) {
      p.n_split[s] = 0;
      p.slice[s] = 0;
      continue;
    }
    const int share = ceil_div(static_cast<int64_t>(want) * len, p.K);
    int n = std::max(ceil_div(len, max_slice), std::min(share, std::max(1, len / kMinSlice)));
    const int slice = (ceil_div(len, n) + 7) / 8 * 8;
    n = ceil_div(len, slice);
    p.n_split[s] = n;
    p.slice[s] = slice;
    total += n;
    widest = std::max(widest, slice);
  }
  p.slice_pad = (widest + 63) / 64 * 64;
  p.total_splits = total;
  const int64_t per = static_cast<int64_t>(p.n_tiles) * total * p.batch;
  return {total > 1 ? per * kTileRows : 0, total > 1 ? per : 0, p.n_tiles};
}

void launch_gemv(const GemvParams& p, c10::ScalarType dtype, cudaStream_t stream) {
  const int nb = batch_tile(p.batch, dtype);
  switch (dtype) {
    case c10::kBFloat16:
      return nb == 8 ? launch_typed<__nv_bfloat16, 8>(p, stream) : launch_typed<__nv_bfloat16, 16>(p, stream);
    case c10::kHalf:
      return nb == 8 ? launch_typed<__half, 8>(p, stream) : launch_typed<__half, 16>(p, stream);
    default:
      switch (nb) {
        case 1:
          return launch_typed<float, 1>(p, stream);
        case 2:
          return launch_typed<float, 2>(p, stream);
        case 4:
          return launch_typed<float, 4>(p, stream);
        case 8:
          return launch_typed<float, 8>(p, stream);
        default:
          return launch_typed<float, 16>(p, stream);
      }
  }
}

}  // namespace drafter_lab::draft_forward::cuda
