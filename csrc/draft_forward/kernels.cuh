// Parameters and launchers of the CUDA draft-step kernels (host and device side share these).
#pragma once

#include <c10/core/ScalarType.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace drafter_lab::draft_forward::cuda {

constexpr int kTileRows = 32;      // output rows per GEMV block; paired epilogues use two halves of 16
constexpr int kMaxGemvBatch = 16;  // larger batches go through cuBLAS
constexpr int kMaxTopk = 16;

enum Epilogue : int {
  kStore = 0,     // out = y
  kResidual = 1,  // out = residual + y
  kQkvRope = 2,   // q -> q_out with RoPE, k (RoPE) and v -> the caches at cache_lens[b]
  kSiluMul = 3,   // out = silu(gate) * up; rows r and r + pair are gate and up
  kLogits = 4,    // per-tile log-sum-exp pieces and top-k candidates of the logits
};

// Where this step's q/k/v go, and the RoPE inputs.
struct QkvOut {
  void* q_out;  // [B, n_heads * head_dim]
  void* k_cache;
  void* v_cache;  // [B, n_kv, cache_size, head_dim]
  const void* positions;
  const void* cache_lens;
  bool positions64, lens64;
  int n_heads, n_kv, head_dim, cache_size;
  const float* rope_inv_freq;  // [head_dim / 2], the reference's frequencies (scaled RoPE included)
};

// Per-(tile, row) partial results of the lm_head: top-k candidates and log-sum-exp pieces.
struct TopkParts {
  int topk, n_tiles;
  float* cand_val;  // [n_tiles, B, topk]
  int* cand_idx;
  float* tile_max;  // [n_tiles, B]
  float* tile_sum;  // sum of exp(logit - tile_max)
};

// y[b, r] = sum_k W[r, k] * x[b, k] over the virtual matrix W whose rows are the stacked rows of up
// to three weights, and whose columns are one or two input segments (each optionally an RMSNorm
// input: x is multiplied by the norm weight on its way to shared memory and 1/rms is applied in
// the epilogue). K is split into slices that never straddle a segment; the last block of a tile to
// finish (atomic counter) reduces the slices in a fixed order and runs the epilogue.
struct GemvParams {
  const void* w[3];
  int row_begin[4];
  int n_wseg;
  int rows;  // virtual rows
  int K;     // columns = x_len[0] + x_len[1]
  int pair;  // 0: tiles of 32 consecutive rows; > 0: rows i and i + pair share a tile
  int n_tiles;
  const void* x[2];       // [B, x_len[s]]
  const void* norm_w[2];  // nullptr: plain input
  int x_len[2];
  int n_split[2];
  int slice[2];
  int slice_pad;  // shared-memory row stride (elements), a multiple of 64
  int total_splits;
  int batch;
  float eps;
  int epilogue;
  void* out;             // [B, rows] (kStore/kResidual) or [B, pair] (kSiluMul)
  const void* residual;  // [B, rows]
  QkvOut qkv;
  TopkParts topk;
  float* part;     // [total_splits, n_tiles, 32, B] when total_splits > 1
  float* part_ss;  // [n_tiles, total_splits, B]
  int* counters;   // [n_tiles], zero on entry
};

// Workspace one GEMV needs (fp32 elements; counters are ints).
struct GemvWork {
  int64_t part, part_ss, counters;
};

// Fills n_tiles and the K split of `p` (whose shapes and batch are set) for the device.
GemvWork plan_gemv(GemvParams& p, c10::ScalarType dtype, int sm_count);
void launch_gemv(const GemvParams& p, c10::ScalarType dtype, cudaStream_t stream);

struct AttnParams {
  const void* q;  // [B, n_heads * head_dim], RoPE applied
  void* out;      // [B, n_heads * head_dim]
  const void* k_cache;
  const void* v_cache;
  const void* cache_lens;
  bool lens64;
  int batch, n_heads, n_kv, head_dim, cache_size;
  int chunk, n_split;  // keys per block, blocks per (row, kv head)
  float scale;
  float* part_o;   // [B, n_heads, n_split, head_dim]
  float* part_ml;  // [B, n_heads, n_split, 2]
  int* counters;   // [B * n_kv], zero on entry
};

// Chooses chunk/n_split for the device; returns the dynamic shared memory the launch needs.
int plan_attention(AttnParams& p, c10::ScalarType dtype, int sm_count, int smem_optin);
void launch_attention(const AttnParams& p, c10::ScalarType dtype, int smem, cudaStream_t stream);

// cat(rmsnorm(embeds), rmsnorm(hidden)) style rows: out[b, offset + i] (batched path).
void launch_rms_norm(const void* x, const void* w, void* out, int batch, int hidden, int out_ld, int offset,
                     float eps, c10::ScalarType dtype, cudaStream_t stream);
// RoPE on q and k from separate projections, k/v written into the caches (batched path).
void launch_rope_cache(const void* q, const void* k, const void* v, const QkvOut& o, int batch,
                       c10::ScalarType dtype, cudaStream_t stream);
// Top-k candidates and log-sum-exp pieces of materialised logits [B, vocab] (batched path).
void launch_logits_parts(const void* logits, int batch, int vocab, const TopkParts& t, c10::ScalarType dtype,
                         cudaStream_t stream);
// log-probs and d2t-mapped ids of the top-k from the per-tile parts.
void launch_topk_merge(const TopkParts& t, int batch, const int64_t* d2t, int64_t* ids, float* logp,
                       cudaStream_t stream);

}  // namespace drafter_lab::draft_forward::cuda
