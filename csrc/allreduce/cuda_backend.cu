// CUDA backends of the all-reduce: one kernel per call over a fixed grid of `blocks` CTAs. CTA b
// owns a fixed region of every buffer (b * stride) and its own flag lines and generation counter,
// so CTAs never wait for each other and a call is one launch with no host work (graph capturable).
//
// Readiness: after its data writes, a CTA syncs and one thread stores flag = (signature << 32 |
// generation) with st.release.sys; readers poll with ld.acquire.sys, sync, then read. Buffers
// alternate by generation parity; CTA b rewrites a buffer only after seeing every peer's flag of
// the call in between, which peers post after finishing their reads (no end barrier).
// LL calls (ll_kernel, ll_fused_kernel, below) carry readiness in the data packets instead.
#include "allreduce/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace drafter_lab {
namespace allreduce {
namespace {

constexpr int kThreads = 512;
constexpr int kLLPerThread = 4;  // LL packets a thread holds until the call is confirmed

#define DL_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    cudaError_t err_ = (expr);                                                                 \
    if (err_ != cudaSuccess) throw CommError(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// Written by the first failing CTA into mapped pinned host memory; read by the host without sync.
struct Status {
  int32_t code;  // Fail
  int32_t peer;
  uint32_t gen;
  int32_t block;
  int32_t on;        // Waited: what the CTA read when it failed
  uint32_t index;    // kOnPacket: which packet
  uint32_t seen[2];  // what it last read there: a flag's generation and signature, or a packet's two stamps
};
enum Fail : int32_t { kFine = 0, kTimedOut = 1, kMismatched = 2, kOutOfStep = 3 };
enum Waited : int32_t { kOnFlag0 = 0, kOnFlag1 = 1, kOnPacket = 2 };

// What a failing wait reports beside its peer and call: where it read, and the last value there
// (a timeout on a stale packet and one on a peer that never came read differently).
struct Seen {
  int32_t on;
  uint32_t index, lo, hi;
};
__device__ __forceinline__ Seen flag_seen(int phase, uint64_t word) {
  return {phase, 0u, (uint32_t)word, (uint32_t)(word >> 32)};
}

struct Params {
  char* slots;             // where peers' contributions and flags are read: the segment (host) or our buffer (IPC)
  char* peer[kMaxRanks];   // IPC: every peer's buffer (we push into it); host-staged: unused
  Layout layout;
  uint32_t* counters;      // per-CTA generation (device memory)
  int32_t* claim;          // first failure claims it (device memory), then fills `status`
  Status* status;          // mapped host memory
  const void* in;
  void* out;
  const void* residual;
  void* residual_out;
  const void* weight;
  uint64_t numel, hidden;
  float eps;
  uint32_t sig;
  int rank, world;
  uint64_t timeout_ns;
  bool aligned;
};

template <typename T>
struct Conv;
template <>
struct Conv<float> {
  __device__ static float load(float x) { return x; }
  __device__ static float store(float x) { return x; }
};
template <>
struct Conv<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Conv<__half> {
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float x) { return __float2half_rn(x); }
};

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_volatile8(uint64_t* p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_volatile16(uint4* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint4 ld_volatile16(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Peer data is read around L1: host-staged lines must be refetched from host memory (.cv), IPC
// lines written by a peer into our memory are coherent in L2 (.cg).
template <bool kPush, typename U>
__device__ __forceinline__ U ld_peer(const U* p) {
  if constexpr (kPush)
    return __ldcg(p);
  else
    return __ldcv(p);
}

// 16 bytes of T. Loops run over packs in the same order whether or not pointers are 16-byte
// aligned (only the load width changes), so the fp32 math and its order never depend on alignment.
template <typename T>
struct Pack {
  static constexpr int V = 16 / sizeof(T);
  uint4 raw;
  __device__ T get(int j) const {
    T v;
    memcpy(&v, reinterpret_cast<const char*>(&raw) + j * sizeof(T), sizeof(T));
    return v;
  }
  __device__ void set(int j, T v) { memcpy(reinterpret_cast<char*>(&raw) + j * sizeof(T), &v, sizeof(T)); }
};

template <typename T>
__device__ __forceinline__ T load_elem(const T* p, bool peer, bool push) {
  if (!peer) return *p;
  if constexpr (sizeof(T) == 2) {
    const unsigned short bits = push ? __ldcg(reinterpret_cast<const unsigned short*>(p))
                                     : __ldcv(reinterpret_cast<const unsigned short*>(p));
    T v;
    memcpy(&v, &bits, 2);
    return v;
  } else {
    return push ? __ldcg(p) : __ldcv(p);
  }
}

template <typename T, bool kPush>
__device__ __forceinline__ Pack<T> load_pack(const T* base, uint64_t i, bool vec, bool peer) {
  Pack<T> u;
  if (vec) {
    const uint4* s = reinterpret_cast<const uint4*>(base) + i;
    u.raw = peer ? ld_peer<kPush>(s) : *s;
  } else {
#pragma unroll
    for (int j = 0; j < Pack<T>::V; ++j) u.set(j, load_elem(base + i * Pack<T>::V + j, peer, kPush));
  }
  return u;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* base, uint64_t i, const Pack<T>& u, bool vec) {
  if (vec) {
    reinterpret_cast<uint4*>(base)[i] = u.raw;
  } else {
#pragma unroll
    for (int j = 0; j < Pack<T>::V; ++j) base[i * Pack<T>::V + j] = u.get(j);
  }
}

__device__ void report(const Params& p, Fail code, int peer, uint32_t gen, Seen seen, int* s_fail) {
  *s_fail = 1;
  if (atomicCAS(p.claim, 0, 1) == 0) {
    volatile Status* s = p.status;
    s->peer = peer;
    s->gen = gen;
    s->block = (int32_t)blockIdx.x;
    s->on = seen.on;
    s->index = seen.index;
    s->seen[0] = seen.lo;
    s->seen[1] = seen.hi;
    __threadfence_system();
    s->code = code;
    __threadfence_system();
  }
}

// Threads 0..world-1 each wait for one peer's flag of (gen, phase, CTA); false if any failed.
__device__ bool wait_peers(const Params& p, uint32_t gen, int phase, int* s_fail) {
  const int t = threadIdx.x;
  if (t < p.world && t != p.rank) {
    const uint64_t* f = &p.layout.flag(p.slots, t, gen, phase, blockIdx.x)->word;
    uint64_t started = 0;
    for (uint32_t spins = 1;; ++spins) {
      const uint64_t w = ld_acquire_sys(f);
      const int32_t ahead = (int32_t)((uint32_t)w - gen);  // modulo 2^32
      if (ahead == 0) {
        if ((uint32_t)(w >> 32) != p.sig) report(p, kMismatched, t, gen, flag_seen(phase, w), s_fail);
        break;
      }
      if (ahead > 0) {
        report(p, kOutOfStep, t, gen, flag_seen(phase, w), s_fail);
        break;
      }
      if (spins % 256 == 0) {
        if (*reinterpret_cast<volatile int*>(s_fail) != 0) break;  // another thread of this CTA failed
        const uint64_t now = globaltimer();
        if (started == 0) started = now;
        if (now - started > p.timeout_ns) {
          report(p, kTimedOut, t, gen, flag_seen(phase, w), s_fail);
          break;
        }
      }
    }
  }
  __syncthreads();
  return *s_fail == 0;
}

// Stores this CTA's flag of (gen, phase) where readers look: our slot in the segment, or our slot
// in every peer's buffer. `release`: after our data writes; else relaxed (LL's, which orders nothing).
template <bool kPush>
__device__ void post_flag(const Params& p, uint32_t gen, int phase, bool release) {
  const uint64_t word = flag_word(gen, p.sig);
  auto store = [&](char* base) {
    uint64_t* f = &p.layout.flag(base, p.rank, gen, phase, blockIdx.x)->word;
    release ? st_release_sys(f, word) : st_volatile8(f, word);
  };
  if (kPush) {
    for (int q = 0; q < p.world; ++q)
      if (q != p.rank) store(p.peer[q]);
  } else {
    store(p.slots);
  }
}

// Releases this CTA's flag of (gen, phase) once all its threads' data writes are done.
template <bool kPush>
__device__ void publish(const Params& p, uint32_t gen, int phase) {
  __syncthreads();
  if (threadIdx.x == 0) post_flag<kPush>(p, gen, phase, true);
}

// Stamps every LL packet this CTA may send in `gen`'s buffer, where its readers poll them (as
// ll_send writes them), with `stamp` in both halves. Packets match a generation exactly, so one that
// a run of smaller calls left unwritten would read as fresh once the counter came round to its
// generation again, 2^32 calls later.
template <bool kPush>
__device__ void stamp_packets(const Params& p, uint32_t gen, uint32_t stamp) {
  const uint64_t off = blockIdx.x * p.layout.block_stride(), packets = p.layout.block_stride() / 16;
  const uint4 packet = make_uint4(0, stamp, 0, stamp);
  auto fill = [&](char* base) {
    uint4* dst = reinterpret_cast<uint4*>(p.layout.ll(base, p.rank, gen) + off);
    for (uint64_t i = threadIdx.x; i < packets; i += blockDim.x) st_volatile16(dst + i, packet);
  };
  if (kPush) {
    for (int q = 0; q < p.world; ++q)
      if (q != p.rank) fill(p.peer[q]);
  } else if (p.world > 1) {
    fill(p.slots);
  }
}

// This CTA's generation for the call (shared by its threads), with its failure flag cleared; its
// flag lines and LL packets of the call's buffer stamped with gen - 2 when a refresh is due
// (layout.h), before anything of the call is written there.
template <bool kPush>
__device__ uint32_t begin_call(const Params& p, uint32_t* s_gen, int* s_fail) {
  if (threadIdx.x == 0) {
    const uint32_t gen = p.counters[blockIdx.x] + 1;
    if (refresh_due(gen)) {
      post_flag<kPush>(p, gen - 2, 0, false);
      post_flag<kPush>(p, gen - 2, 1, false);
    }
    *s_gen = gen;
    *s_fail = 0;
  }
  __syncthreads();
  const uint32_t gen = *s_gen;
  if (p.layout.with_ll && refresh_due(gen)) {
    stamp_packets<kPush>(p, gen, gen - 2);
    __threadfence_system();  // the call's own packets, from any thread, land after the stamps
    __syncthreads();
  }
  return gen;
}

template <bool kPush>
__device__ void copy_bytes(char* dst, const char* src, uint64_t bytes, bool vec16, bool from_peer) {
  uint64_t done = 0;
  if (vec16) {
    const uint64_t n16 = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (uint64_t i = threadIdx.x; i < n16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = from_peer ? ld_peer<kPush>(s + i) : s[i];
    done = n16 * 16;
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(src);
  for (uint64_t i = done + threadIdx.x; i < bytes; i += blockDim.x)
    dst[i] = (char)(from_peer ? ld_peer<kPush>(b + i) : b[i]);
}

// out[k][i] = round(sum over ranks of src[r][i]) for i < n, in rank order, for every output k.
template <typename T, bool kPush>
__device__ void reduce(const Params& p, const T* const* src, T* const* outs, int n_outs, uint64_t n, bool vec) {
  constexpr int V = Pack<T>::V;
  const uint64_t nv = n / V;
  for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float acc[V];
    for (int r = 0; r < p.world; ++r) {
      const Pack<T> u = load_pack<T, kPush>(src[r], i, vec, r != p.rank);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = r == 0 ? Conv<T>::load(u.get(j)) : acc[j] + Conv<T>::load(u.get(j));
    }
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.set(j, Conv<T>::store(acc[j]));
    for (int k = 0; k < n_outs; ++k) store_pack(outs[k], i, o, vec);
  }
  for (uint64_t e = nv * V + threadIdx.x; e < n; e += blockDim.x) {
    float acc = 0.f;
    for (int r = 0; r < p.world; ++r) {
      const float v = Conv<T>::load(load_elem(src[r] + e, r != p.rank, kPush));
      acc = r == 0 ? v : acc + v;
    }
    const T o = Conv<T>::store(acc);
    for (int k = 0; k < n_outs; ++k) outs[k][e] = o;
  }
}

// Deterministic block sum (fixed shuffle tree, warps combined in order): identical on every rank.
__device__ float block_sum(float v, float* scratch) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < (int)(blockDim.x / 32); ++w) s += scratch[w];
    scratch[32] = s;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();
  return total;
}

// One row: r = sum over ranks + residual (fp32) -> residual outputs; rmsnorm(r) * weight -> outputs.
// Thread t owns packs t, t + blockDim, ... and the tail elements after them, in every pass.
template <typename T, bool kPush>
__device__ void fused_row(const Params& p, const T* const* src, const T* residual, T* const* outs,
                          T* const* res_outs, int n_outs, float* acc, float* scratch) {
  constexpr int V = Pack<T>::V;
  const uint64_t H = p.hidden, nv = H / V;
  const T* w = static_cast<const T*>(p.weight);
  const bool vec = p.aligned;
  float ss = 0.f;
  for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float a[V];
    for (int r = 0; r < p.world; ++r) {
      const Pack<T> u = load_pack<T, kPush>(src[r], i, vec, r != p.rank);
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = r == 0 ? Conv<T>::load(u.get(j)) : a[j] + Conv<T>::load(u.get(j));
    }
    const Pack<T> res = load_pack<T, kPush>(residual, i, vec, false);
    Pack<T> ro;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      a[j] += Conv<T>::load(res.get(j));
      acc[i * V + j] = a[j];
      ro.set(j, Conv<T>::store(a[j]));
      ss += a[j] * a[j];
    }
    for (int k = 0; k < n_outs; ++k) store_pack(res_outs[k], i, ro, vec);
  }
  for (uint64_t e = nv * V + threadIdx.x; e < H; e += blockDim.x) {
    float a = 0.f;
    for (int r = 0; r < p.world; ++r) {
      const float v = Conv<T>::load(load_elem(src[r] + e, r != p.rank, kPush));
      a = r == 0 ? v : a + v;
    }
    a += Conv<T>::load(residual[e]);
    acc[e] = a;
    const T ro = Conv<T>::store(a);
    for (int k = 0; k < n_outs; ++k) res_outs[k][e] = ro;
    ss += a * a;
  }
  ss = block_sum(ss, scratch);
  // IEEE division and square root even under --use_fast_math: the same bits on every rank and build.
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)H), p.eps)));
  for (uint64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const Pack<T> wp = load_pack<T, kPush>(w, i, vec, false);
    Pack<T> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.set(j, Conv<T>::store(acc[i * V + j] * inv * Conv<T>::load(wp.get(j))));
    for (int k = 0; k < n_outs; ++k) store_pack(outs[k], i, o, vec);
  }
  for (uint64_t e = nv * V + threadIdx.x; e < H; e += blockDim.x) {
    const T o = Conv<T>::store(acc[e] * inv * Conv<T>::load(w[e]));
    for (int k = 0; k < n_outs; ++k) outs[k][e] = o;
  }
  __syncthreads();  // acc is reused by the next row
}

struct Span {
  uint64_t lo, hi;
};

__host__ __device__ inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

__device__ Span part(uint64_t n, uint64_t parts, uint64_t align, uint64_t i) {
  const uint64_t per = round_up(ceil_div(n, parts), align);
  const uint64_t lo = min(n, i * per);
  return {lo, min(n, lo + per)};
}

// kKind: a Kind. Elements (sum) or rows (fused) are split contiguously over the CTAs; within a
// CTA, two-shot splits them again over the ranks.
template <typename T, int kKind, bool kPush>
__global__ void __launch_bounds__(kThreads) allreduce_kernel(Params p) {
  constexpr bool kFused = kKind == kFusedOneShot || kKind == kFusedTwoShot;
  constexpr bool kTwoShot = kKind == kSumTwoShot || kKind == kFusedTwoShot;
  constexpr uint64_t V = 16 / sizeof(T);
  extern __shared__ float s_acc[];
  __shared__ float s_scratch[33];
  __shared__ uint32_t s_gen;
  __shared__ int s_fail;
  const int b = blockIdx.x, me = p.rank;
  const uint32_t gen = begin_call<kPush>(p, &s_gen, &s_fail);
  const uint64_t stride = p.layout.block_stride();
  const uint64_t row = kFused ? p.hidden : 1;  // elements per unit
  const uint64_t units = p.numel / row;
  const Span mine_b = part(units, gridDim.x, kFused ? 1 : V, b);  // this CTA's units
  const uint64_t lo = mine_b.lo * row, n = (mine_b.hi - mine_b.lo) * row;
  const T* in = static_cast<const T*>(p.in) + lo;
  T* out = static_cast<T*>(p.out) + lo;
  const uint64_t data_off = b * stride, result_off = b * 2 * stride;
  const bool vec = p.aligned;

  // Units of the CTA's share each rank reduces in two-shot (all of them in one-shot).
  const uint64_t cta_units = mine_b.hi - mine_b.lo;
  auto rank_span = [&](int r) -> Span {
    if (!kTwoShot) return {0, n};
    Span s = part(cta_units, p.world, kFused ? 1 : V, r);
    return {s.lo * row, s.hi * row};
  };

  // 1. stage: host-staged writes the whole share to our slot; IPC pushes to each peer what it reads.
  if (kPush) {
    for (int q = 0; q < p.world; ++q) {
      if (q == me) continue;
      const Span s = rank_span(q);
      copy_bytes<kPush>(p.layout.data(p.peer[q], me, gen) + data_off + s.lo * sizeof(T),
                        reinterpret_cast<const char*>(in + s.lo), (s.hi - s.lo) * sizeof(T), vec, false);
    }
  } else if (p.world > 1) {
    copy_bytes<kPush>(p.layout.data(p.slots, me, gen) + data_off, reinterpret_cast<const char*>(in), n * sizeof(T),
                      vec, false);
  }
  publish<kPush>(p, gen, 0);
  if (!wait_peers(p, gen, 0, &s_fail)) return;

  // 2. reduce our span; two-shot also puts it in the result area where peers gather it.
  const Span my = rank_span(me);
  const T* src[kMaxRanks];
  for (int r = 0; r < p.world; ++r)
    src[r] = r == me ? in + my.lo
                     : reinterpret_cast<const T*>(p.layout.data(p.slots, r, gen) + data_off) + my.lo;
  T* outs[kMaxRanks + 1];
  T* res_outs[kMaxRanks + 1];
  int n_outs = 0;
  outs[n_outs] = out + my.lo;
  if (kFused) res_outs[n_outs] = static_cast<T*>(p.residual_out) + lo + my.lo;
  ++n_outs;
  if (kTwoShot && p.world > 1) {
    for (int q = 0; q < p.world; ++q) {
      if (kPush ? q == me : q != me) continue;
      char* base = p.layout.result(kPush ? p.peer[q] : p.slots, me, gen) + result_off;
      outs[n_outs] = reinterpret_cast<T*>(base) + my.lo;
      if (kFused) res_outs[n_outs] = reinterpret_cast<T*>(base + stride) + my.lo;
      ++n_outs;
    }
  }
  if (kFused) {
    const T* residual = static_cast<const T*>(p.residual) + lo;
    for (uint64_t r0 = my.lo; r0 < my.hi; r0 += row) {
      const T* row_src[kMaxRanks];
      T* row_outs[kMaxRanks + 1];
      T* row_res[kMaxRanks + 1];
      for (int r = 0; r < p.world; ++r) row_src[r] = src[r] + (r0 - my.lo);
      for (int k = 0; k < n_outs; ++k) {
        row_outs[k] = outs[k] + (r0 - my.lo);
        row_res[k] = res_outs[k] + (r0 - my.lo);
      }
      fused_row<T, kPush>(p, row_src, residual + r0, row_outs, row_res, n_outs, s_acc, s_scratch);
    }
  } else {
    reduce<T, kPush>(p, src, outs, n_outs, my.hi - my.lo, vec);
  }

  // 3. two-shot: gather the other ranks' spans.
  if (kTwoShot && p.world > 1) {
    publish<kPush>(p, gen, 1);
    if (!wait_peers(p, gen, 1, &s_fail)) return;
    for (int r = 0; r < p.world; ++r) {
      if (r == me) continue;
      const Span s = rank_span(r);
      const char* base = p.layout.result(p.slots, r, gen) + result_off;
      copy_bytes<kPush>(reinterpret_cast<char*>(out + s.lo), base + s.lo * sizeof(T), (s.hi - s.lo) * sizeof(T), vec,
                        true);
      if (kFused)
        copy_bytes<kPush>(reinterpret_cast<char*>(static_cast<T*>(p.residual_out) + lo + s.lo),
                          base + stride + s.lo * sizeof(T), (s.hi - s.lo) * sizeof(T), vec, true);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) p.counters[b] = gen;
}

// LL ("low latency") one-shot: readiness travels inside the data. A 16-byte packet is two
// 8-byte halves of (4 data bytes, the call's generation), sent with one store; an aligned 8-byte
// half is never torn, so a reader that sees the generation in both halves also has their data.
// Against the flag protocol this drops the fence before the flag and the flag-then-data round
// trip: one write and one read over the link per packet, at the price of sending twice the bytes.
// The flag line is still posted (relaxed, with no fence before it): it confirms the call's
// signature, and tells a reader stuck on a packet a peer in another call from a late one.

// The 8 data bytes of packet i: elements [i * E, (i + 1) * E) of n, zero past the end.
template <typename T>
__device__ __forceinline__ uint2 ll_load(const T* in, uint64_t i, uint64_t n, bool vec) {
  constexpr int E = 8 / sizeof(T);
  if (vec && (i + 1) * E <= n) return reinterpret_cast<const uint2*>(in)[i];
  T v[E];
#pragma unroll
  for (int j = 0; j < E; ++j) v[j] = i * E + j < n ? in[i * E + j] : Conv<T>::store(0.f);
  uint2 d;
  memcpy(&d, v, sizeof(d));
  return d;
}

template <typename T>
__device__ __forceinline__ void ll_store(T* out, uint64_t i, uint64_t n, bool vec, uint2 d) {
  constexpr int E = 8 / sizeof(T);
  if (vec && (i + 1) * E <= n) {
    reinterpret_cast<uint2*>(out)[i] = d;
    return;
  }
  T v[E];
  memcpy(v, &d, sizeof(d));
#pragma unroll
  for (int j = 0; j < E; ++j)
    if (i * E + j < n) out[i * E + j] = v[j];
}

// Polls `peer`'s packet i (of this CTA's, from `src`) until both halves carry `gen`. Every 256 polls it looks at what else may
// have happened: a failure elsewhere in this rank's kernel, the peer's flag line showing another
// call (mismatch) or a later one (out of step), or the timeout; false once the call failed.
__device__ bool ll_wait(const Params& p, const uint4* src, uint64_t i, int peer, uint32_t gen, uint2* d, int* s_fail) {
  uint64_t started = 0;
  for (uint32_t spins = 1;; ++spins) {
    const uint4 v = ld_volatile16(src + i);
    if (v.y == gen && v.w == gen) {
      *d = make_uint2(v.x, v.z);
      return true;
    }
    if (spins % 256 != 0) continue;
    if (*reinterpret_cast<volatile int32_t*>(p.claim) != 0) *s_fail = 1;  // another CTA of this rank failed
    if (*reinterpret_cast<volatile int*>(s_fail) != 0) return false;
    const uint64_t w = ld_acquire_sys(&p.layout.flag(p.slots, peer, gen, 0, blockIdx.x)->word);
    const int32_t ahead = (int32_t)((uint32_t)w - gen);  // modulo 2^32
    if (ahead == 0 && (uint32_t)(w >> 32) != p.sig) {
      report(p, kMismatched, peer, gen, flag_seen(0, w), s_fail);
      return false;
    }
    if (ahead > 0) {
      report(p, kOutOfStep, peer, gen, flag_seen(0, w), s_fail);
      return false;
    }
    const uint64_t now = globaltimer();
    if (started == 0) started = now;
    if (now - started > p.timeout_ns) {
      report(p, kTimedOut, peer, gen, {kOnPacket, (uint32_t)i, v.y, v.w}, s_fail);
      return false;
    }
  }
}

// Starts an LL call in this CTA: its generation, and its flag line posted (relaxed) at once.
template <bool kPush>
__device__ uint32_t ll_begin(const Params& p, uint32_t* s_gen, int* s_fail) {
  const uint32_t gen = begin_call<kPush>(p, s_gen, s_fail);
  if (threadIdx.x == 0) post_flag<kPush>(p, gen, 0, false);
  return gen;
}

// Sends packet i of this CTA: into our slot (host-staged) or our slot in every peer's buffer (IPC).
template <bool kPush>
__device__ __forceinline__ void ll_send(const Params& p, uint32_t gen, uint64_t i, uint2 d) {
  const uint64_t off = blockIdx.x * p.layout.block_stride();
  const uint4 packet = make_uint4(d.x, gen, d.y, gen);
  if (kPush) {
    for (int q = 0; q < p.world; ++q)
      if (q != p.rank) st_volatile16(reinterpret_cast<uint4*>(p.layout.ll(p.peer[q], p.rank, gen) + off) + i, packet);
  } else if (p.world > 1) {
    st_volatile16(reinterpret_cast<uint4*>(p.layout.ll(p.slots, p.rank, gen) + off) + i, packet);
  }
}

// Adds the E elements of packet i of every rank, in rank order, into acc (ours from `own`).
template <typename T>
__device__ __forceinline__ bool ll_sum(const Params& p, uint32_t gen, uint64_t i, uint2 own, float* acc, int* s_fail) {
  constexpr int E = 8 / sizeof(T);
  const uint64_t off = blockIdx.x * p.layout.block_stride();
  for (int r = 0; r < p.world; ++r) {
    uint2 d = own;
    if (r != p.rank && !ll_wait(p, reinterpret_cast<const uint4*>(p.layout.ll(p.slots, r, gen) + off), i, r, gen,
                                &d, s_fail))
      return false;
    T v[E];
    memcpy(v, &d, sizeof(d));
#pragma unroll
    for (int j = 0; j < E; ++j) acc[j] = r == 0 ? Conv<T>::load(v[j]) : acc[j] + Conv<T>::load(v[j]);
  }
  return true;
}

// CTA b sends its share of the elements (split as the one-shot kernel splits them) as packets
// into the LL area at b * stride, sums every rank's packets as they arrive (each thread keeps its
// at most kLLPerThread results in registers), and writes them out only after the peers' flag
// lines confirmed the same call: packets carry the generation but not the signature, and ranks
// sending different sizes must fail, not mix.
// When to confirm (kConfirmFirst): over IPC a reader polls its own memory, so it polls packets at
// once and reads the flag lines while they arrive, at no round trip of their own. Host-staged,
// every poll is a read across PCIe, and hundreds of threads polling packets not yet there would
// crowd the link the packets travel on; there the flag line (posted before the packets, with no
// fence) is waited for first as a hint, and the packets read after it, polled again only if late.
// A packet is rewritten two calls later, as staging is: by then every peer has finished the
// kernel that read it (we confirmed its flag lines of the call in between, posted by a kernel
// that starts after that one ends on its stream).
template <typename T, bool kPush>
__global__ void __launch_bounds__(kThreads) ll_kernel(Params p) {
  constexpr int E = 8 / sizeof(T), V = 16 / sizeof(T);
  constexpr bool kConfirmFirst = !kPush;
  __shared__ uint32_t s_gen;
  __shared__ int s_fail;
  const uint32_t gen = ll_begin<kPush>(p, &s_gen, &s_fail);
  const Span mine = part(p.numel, gridDim.x, V, blockIdx.x);
  const uint64_t n = mine.hi - mine.lo, packets = ceil_div(n, E);
  const T* in = static_cast<const T*>(p.in) + mine.lo;
  T* out = static_cast<T*>(p.out) + mine.lo;
  const bool vec = p.aligned;
  uint2 own[kLLPerThread], result[kLLPerThread];
#pragma unroll
  for (int k = 0; k < kLLPerThread; ++k) {
    const uint64_t i = threadIdx.x + (uint64_t)k * blockDim.x;
    if (i >= packets) break;
    own[k] = ll_load(in, i, n, vec);
    ll_send<kPush>(p, gen, i, own[k]);
  }
  if (kConfirmFirst && !wait_peers(p, gen, 0, &s_fail)) return;
#pragma unroll
  for (int k = 0; k < kLLPerThread; ++k) {
    const uint64_t i = threadIdx.x + (uint64_t)k * blockDim.x;
    float acc[E];
    if (i >= packets || !ll_sum<T>(p, gen, i, own[k], acc, &s_fail)) break;
    T o[E];
#pragma unroll
    for (int j = 0; j < E; ++j) o[j] = Conv<T>::store(acc[j]);
    memcpy(&result[k], o, sizeof(result[k]));
  }
  if (!kConfirmFirst && !wait_peers(p, gen, 0, &s_fail)) return;
#pragma unroll
  for (int k = 0; k < kLLPerThread; ++k) {
    const uint64_t i = threadIdx.x + (uint64_t)k * blockDim.x;
    if (i < packets) ll_store(out, i, n, vec, result[k]);
  }
  __syncthreads();
  if (threadIdx.x == 0) p.counters[blockIdx.x] = gen;
}

// LL sum + residual + RMSNorm. Rows are split over the CTAs as in the one-shot fused kernel; each
// row is sent as its own run of packets (so no packet straddles two rows), summed with the
// residual into shared memory in fp32, normed, and written once the flag lines confirmed the call
// (before its first row is read or after, as in ll_kernel).
template <typename T, bool kPush>
__global__ void __launch_bounds__(kThreads) ll_fused_kernel(Params p) {
  constexpr int E = 8 / sizeof(T);
  constexpr bool kConfirmFirst = !kPush;
  extern __shared__ float s_acc[];
  __shared__ float s_scratch[33];
  __shared__ uint32_t s_gen;
  __shared__ int s_fail;
  const uint32_t gen = ll_begin<kPush>(p, &s_gen, &s_fail);
  const uint64_t H = p.hidden, row_packets = ceil_div(H, E);
  const Span mine = part(p.numel / H, gridDim.x, 1, blockIdx.x);
  const bool vec = p.aligned;  // rows are 16-byte multiples then
  const T* w = static_cast<const T*>(p.weight);
  for (uint64_t row = mine.lo; row < mine.hi; ++row) {
    const T* x = static_cast<const T*>(p.in) + row * H;
    for (uint64_t i = threadIdx.x; i < row_packets; i += blockDim.x)
      ll_send<kPush>(p, gen, (row - mine.lo) * row_packets + i, ll_load(x, i, H, vec));
  }
  if (kConfirmFirst && mine.lo < mine.hi && !wait_peers(p, gen, 0, &s_fail)) return;
  for (uint64_t row = mine.lo; row < mine.hi; ++row) {
    const T* x = static_cast<const T*>(p.in) + row * H;
    const T* residual = static_cast<const T*>(p.residual) + row * H;
    float ss = 0.f;
    for (uint64_t i = threadIdx.x; i < row_packets; i += blockDim.x) {
      float a[E];
      if (!ll_sum<T>(p, gen, (row - mine.lo) * row_packets + i, ll_load(x, i, H, vec), a, &s_fail)) break;
      T res[E];
      const uint2 rd = ll_load(residual, i, H, vec);
      memcpy(res, &rd, sizeof(rd));
#pragma unroll
      for (int j = 0; j < E; ++j) {
        if (i * E + j >= H) break;
        a[j] += Conv<T>::load(res[j]);
        s_acc[i * E + j] = a[j];
        ss += a[j] * a[j];
      }
    }
    if (!kConfirmFirst && row == mine.lo && !wait_peers(p, gen, 0, &s_fail)) return;
    ss = block_sum(ss, s_scratch);  // its barriers also make s_fail the same for every thread
    if (s_fail != 0) return;
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)H), p.eps)));
    T* out = static_cast<T*>(p.out) + row * H;
    T* res_out = static_cast<T*>(p.residual_out) + row * H;
    for (uint64_t e = threadIdx.x; e < H; e += blockDim.x) {
      res_out[e] = Conv<T>::store(s_acc[e]);
      out[e] = Conv<T>::store(s_acc[e] * inv * Conv<T>::load(w[e]));
    }
    __syncthreads();  // s_acc is reused by the next row
  }
  __syncthreads();
  if (threadIdx.x == 0) p.counters[blockIdx.x] = gen;
}

void launch_kernel(void (*kernel)(Params), const Params& p, uint32_t grid, size_t smem, cudaStream_t stream) {
  if (smem > 48 * 1024) DL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<grid, kThreads, smem, stream>>>(p);
  DL_CUDA_CHECK(cudaGetLastError());
}

template <typename T, bool kPush>
void launch_kind(const Params& p, uint32_t kind, uint32_t grid, size_t smem, cudaStream_t stream) {
  switch (kind) {
    case kSumOneShot: return launch_kernel(allreduce_kernel<T, kSumOneShot, kPush>, p, grid, smem, stream);
    case kSumTwoShot: return launch_kernel(allreduce_kernel<T, kSumTwoShot, kPush>, p, grid, smem, stream);
    case kFusedOneShot: return launch_kernel(allreduce_kernel<T, kFusedOneShot, kPush>, p, grid, smem, stream);
    case kFusedTwoShot: return launch_kernel(allreduce_kernel<T, kFusedTwoShot, kPush>, p, grid, smem, stream);
    case kSumLL: return launch_kernel(ll_kernel<T, kPush>, p, grid, smem, stream);
    case kFusedLL: return launch_kernel(ll_fused_kernel<T, kPush>, p, grid, smem, stream);
  }
}

template <bool kPush>
void launch_push(const Params& p, const Call& c, uint32_t grid, size_t smem, cudaStream_t stream) {
  switch (c.dtype) {
    case kF32: return launch_kind<float, kPush>(p, c.kind, grid, smem, stream);
    case kBF16: return launch_kind<__nv_bfloat16, kPush>(p, c.kind, grid, smem, stream);
    case kF16: return launch_kind<__half, kPush>(p, c.kind, grid, smem, stream);
  }
}

// Restores the caller's current device on scope exit.
struct DeviceScope {
  int previous = 0;
  explicit DeviceScope(int device) {
    DL_CUDA_CHECK(cudaGetDevice(&previous));
    DL_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous); }
};

}  // namespace

struct CudaBackend::Impl {
  uint32_t backend;
  int device;
  Params base{};
  Header* header = nullptr;
  void* registered = nullptr;  // host-staged: the segment mapping we registered
  char* own = nullptr;         // IPC: our buffer
  Status* host_status = nullptr;
  bool opened[kMaxRanks] = {};
  double timeout_s;
};

CudaBackend::CudaBackend(uint32_t backend, int device, Channel& ch) : impl_(new Impl) {
  Impl& m = *impl_;
  m.backend = backend;
  m.device = device;
  m.header = ch.header();
  m.timeout_s = ch.timeout_s();
  DeviceScope scope(device);
  Params& p = m.base;
  p.layout = ch.layout();
  p.rank = ch.rank();
  p.world = ch.world();
  p.timeout_ns = ch.timeout_ns();
  DL_CUDA_CHECK(cudaMalloc(&p.counters, kMaxBlocks * sizeof(uint32_t)));
  DL_CUDA_CHECK(cudaMemset(p.counters, 0, kMaxBlocks * sizeof(uint32_t)));
  DL_CUDA_CHECK(cudaMalloc(&p.claim, sizeof(int32_t)));
  DL_CUDA_CHECK(cudaMemset(p.claim, 0, sizeof(int32_t)));
  DL_CUDA_CHECK(cudaHostAlloc(&m.host_status, sizeof(Status), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(m.host_status, 0, sizeof(Status));
  DL_CUDA_CHECK(cudaHostGetDevicePointer(&p.status, m.host_status, 0));
  if (backend == kCudaHost) {
    Segment& seg = ch.segment();
    DL_CUDA_CHECK(cudaHostRegister(seg.base(), seg.size(), cudaHostRegisterMapped | cudaHostRegisterPortable));
    m.registered = seg.base();
    char* dev = nullptr;
    DL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev), seg.base(), 0));
    p.slots = dev + kHeaderBytes;
  } else {
    const size_t bytes = (size_t)p.world * p.layout.slot_bytes;
    DL_CUDA_CHECK(cudaMalloc(&m.own, bytes));
    DL_CUDA_CHECK(cudaMemset(m.own, 0, bytes));
    DL_CUDA_CHECK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle;
    DL_CUDA_CHECK(cudaIpcGetMemHandle(&handle, m.own));
    static_assert(sizeof(handle) <= kIpcHandleBytes, "IPC handle does not fit the header");
    std::memcpy(m.header->ipc_handle[p.rank], &handle, sizeof(handle));
    m.header->ipc_ptr[p.rank] = reinterpret_cast<uint64_t>(m.own);
    m.header->ipc_device[p.rank] = device;
    p.slots = m.own;
  }
}

void CudaBackend::connect() {
  Impl& m = *impl_;
  if (m.backend != kCudaIpc) return;
  DeviceScope scope(m.device);
  const int32_t pid = (int32_t)getpid();
  for (int q = 0; q < m.base.world; ++q) {
    if (q == m.base.rank) continue;
    if (m.header->pids[q] == pid) {  // same process (ranks as streams): IPC handles do not open here
      if (m.header->ipc_device[q] != m.device) {
        cudaError_t e = cudaDeviceEnablePeerAccess(m.header->ipc_device[q], 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
          cudaGetLastError();
        else
          DL_CUDA_CHECK(e);
      }
      m.base.peer[q] = reinterpret_cast<char*>(m.header->ipc_ptr[q]);
      continue;
    }
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, m.header->ipc_handle[q], sizeof(handle));
    void* ptr = nullptr;
    DL_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess));
    m.base.peer[q] = static_cast<char*>(ptr);
    m.opened[q] = true;
  }
}

void CudaBackend::set_generation(uint32_t gen) {
  DeviceScope scope(impl_->device);
  DL_CUDA_CHECK(cudaDeviceSynchronize());  // calls in flight still advance the counters
  const std::vector<uint32_t> counters(kMaxBlocks, gen);
  DL_CUDA_CHECK(cudaMemcpy(impl_->base.counters, counters.data(), kMaxBlocks * sizeof(uint32_t), cudaMemcpyHostToDevice));
}

CudaBackend::~CudaBackend() {
  Impl& m = *impl_;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(m.device);
  cudaDeviceSynchronize();  // our queued kernels may still touch the buffers
  for (int q = 0; q < kMaxRanks; ++q)
    if (m.opened[q]) cudaIpcCloseMemHandle(m.base.peer[q]);
  if (m.own) cudaFree(m.own);
  if (m.registered) cudaHostUnregister(m.registered);
  cudaFreeHost(m.host_status);
  cudaFree(m.base.counters);
  cudaFree(m.base.claim);
  cudaSetDevice(previous);
}

uint64_t CudaBackend::capacity_bytes() const {
  const Layout& l = impl_->base.layout;
  return l.blocks * l.block_stride();
}

uint64_t CudaBackend::ll_capacity_bytes() const {
  const Layout& l = impl_->base.layout;
  return l.blocks * std::min<uint64_t>(l.block_stride() / 2 / 16 * 16, (uint64_t)kThreads * kLLPerThread * 8);
}

uint64_t CudaBackend::ll_capacity_rows(uint64_t hidden, size_t elem_size) const {
  const Layout& l = impl_->base.layout;
  return l.block_stride() / (ceil_div(hidden, 8 / elem_size) * 16) * l.blocks;
}

uint64_t CudaBackend::capacity_rows(uint64_t hidden, size_t elem_size) const {
  const Layout& l = impl_->base.layout;
  return l.block_stride() / (hidden * elem_size) * l.blocks;
}

void CudaBackend::launch(const Call& c, bool aligned, void* stream) {
  Params p = impl_->base;
  p.in = c.in;
  p.out = c.out;
  p.residual = c.residual;
  p.residual_out = c.residual_out;
  p.weight = c.weight;
  p.numel = c.numel;
  p.hidden = c.hidden;
  p.eps = c.eps;
  p.sig = c.sig();
  p.aligned = aligned;
  const bool fused = c.kind == kFusedOneShot || c.kind == kFusedTwoShot || c.kind == kFusedLL;
  const size_t smem = fused ? c.hidden * sizeof(float) : 0;
  if (impl_->backend == kCudaIpc)
    launch_push<true>(p, c, p.layout.blocks, smem, static_cast<cudaStream_t>(stream));
  else
    launch_push<false>(p, c, p.layout.blocks, smem, static_cast<cudaStream_t>(stream));
}

std::string CudaBackend::error() const {
  const volatile Status* s = impl_->host_status;
  const int32_t code = s->code;
  if (code == kFine) return "";
  char buf[256];
  const int rank = impl_->base.rank;
  switch (code) {
    case kTimedOut: {
      // What it last read tells a peer that never came (its older call's stamps) from a write that
      // never became visible or a stale value read as current.
      char where[96];
      if (s->on == kOnPacket)
        std::snprintf(where, sizeof(where), "its LL packet %u, last read stamped #%u/#%u", s->index, s->seen[0],
                      s->seen[1]);
      else
        std::snprintf(where, sizeof(where), "its phase-%d flag line, last read at call #%u", s->on, s->seen[0]);
      std::snprintf(buf, sizeof(buf),
                    "CUDA all-reduce timed out after %.3g s: rank %d waited for rank %d in call #%u (block %d) on %s",
                    impl_->timeout_s, rank, s->peer, s->gen, s->block, where);
      break;
    }
    case kMismatched:
      std::snprintf(buf, sizeof(buf),
                    "CUDA all-reduce call mismatch in call #%u: rank %d sent a different size, dtype or kind than "
                    "rank %d",
                    s->gen, s->peer, rank);
      break;
    default:
      std::snprintf(buf, sizeof(buf), "CUDA all-reduce out of step: rank %d is ahead of rank %d at call #%u", s->peer,
                    rank, s->gen);
  }
  return buf;
}

}  // namespace allreduce
}  // namespace drafter_lab
