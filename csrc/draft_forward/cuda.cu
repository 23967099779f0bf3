// CUDA implementation of drafter_lab::draft_step: host orchestration of the kernels.
//
// B <= kMaxGemvBatch (decode): our kernels only, 7-8 launches, no host sync, CUDA-graph capturable:
//   [fc GEMV] -> qkv GEMV (both RMSNorms in the prologue, RoPE + KV write in the epilogue)
//   -> split-KV attention -> o_proj GEMV (+ residual) -> gate/up GEMV (post norm, SiLU*mul)
//   -> down GEMV (+ residual = hidden_out) -> lm_head GEMV (final norm, per-tile top-k) -> merge.
// Larger B: cuBLAS (at::linear) for the projections, our kernels for the norms, RoPE + KV write,
// attention and the top-k.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "draft_forward/args.h"
#include "draft_forward/kernels.cuh"

namespace drafter_lab::draft_forward {
namespace {

using cuda::AttnParams;
using cuda::GemvParams;
using cuda::GemvWork;
using cuda::QkvOut;
using cuda::TopkParts;

// SM count and opt-in shared memory per block of the current device (driver attribute queries,
// no synchronisation; ATen's cached cudaDeviceProp would pull in the cuBLAS/cuSPARSE headers).
struct Device {
  int sms, smem_optin;
};

Device current_device() {
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  Device d{};
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return d;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

void check_cuda(const DraftStep& s) {
  TORCH_CHECK(s.head_dim == 64 || s.head_dim == 128, "draft_step on CUDA supports head_dim 64 and 128, got ",
              s.head_dim);
  TORCH_CHECK(s.hidden_size % 8 == 0 && s.hidden.size(1) % 8 == 0 && s.inter % 16 == 0,
              "draft_step on CUDA needs H (", s.hidden_size, ") and the hidden input width (", s.hidden.size(1),
              ") to be multiples of 8 and the intermediate size (", s.inter, ") a multiple of 16");
  TORCH_CHECK(s.topk <= cuda::kMaxTopk, "draft_step on CUDA supports topk <= ", cuda::kMaxTopk, ", got ", s.topk);
  const at::Tensor* vectorised[] = {&s.k_cache, &s.v_cache, &s.input_norm, &s.hidden_norm, &s.q, &s.k, &s.v,
                                    &s.o, &s.post_norm, &s.gate, &s.up, &s.down, &s.norm, &s.lm_head};
  for (const at::Tensor* t : vectorised) {
    TORCH_CHECK(aligned16(*t), "draft_step on CUDA needs 16-byte aligned weights and caches");
  }
  TORCH_CHECK(!s.fc || aligned16(*s.fc), "draft_step on CUDA needs a 16-byte aligned fc_weight");
}

QkvOut qkv_out(const DraftStep& s, at::Tensor& q_out) {
  QkvOut o{};
  o.q_out = q_out.data_ptr();
  o.k_cache = s.k_cache.data_ptr();
  o.v_cache = s.v_cache.data_ptr();
  o.positions = s.positions.data_ptr();
  o.cache_lens = s.cache_lens.data_ptr();
  o.positions64 = s.positions.scalar_type() == at::kLong;
  o.lens64 = s.cache_lens.scalar_type() == at::kLong;
  o.n_heads = static_cast<int>(s.n_heads);
  o.n_kv = static_cast<int>(s.n_kv);
  o.head_dim = static_cast<int>(s.head_dim);
  o.cache_size = static_cast<int>(s.cache_size);
  o.rope_inv_freq = s.rope_inv_freq.data_ptr<float>();
  return o;
}

AttnParams attention_params(const DraftStep& s, const at::Tensor& q, at::Tensor& out) {
  AttnParams a{};
  a.q = q.data_ptr();
  a.out = out.data_ptr();
  a.k_cache = s.k_cache.data_ptr();
  a.v_cache = s.v_cache.data_ptr();
  a.cache_lens = s.cache_lens.data_ptr();
  a.lens64 = s.cache_lens.scalar_type() == at::kLong;
  a.batch = static_cast<int>(s.batch);
  a.n_heads = static_cast<int>(s.n_heads);
  a.n_kv = static_cast<int>(s.n_kv);
  a.head_dim = static_cast<int>(s.head_dim);
  a.cache_size = static_cast<int>(s.cache_size);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  return a;
}

// A GEMV over one weight (or stacked weights) and one or two input segments.
GemvParams gemv(const DraftStep& s, std::initializer_list<const at::Tensor*> weights,
                std::initializer_list<std::pair<const at::Tensor*, const at::Tensor*>> inputs, int epilogue) {
  GemvParams p{};
  int row = 0, i = 0;
  for (const at::Tensor* w : weights) {
    p.w[i] = w->data_ptr();
    p.row_begin[i++] = row;
    row += static_cast<int>(w->size(0));
  }
  p.row_begin[i] = row;
  p.n_wseg = i;
  p.rows = row;
  i = 0;
  for (const auto& [x, norm] : inputs) {
    p.x[i] = x->data_ptr();
    p.norm_w[i] = norm ? norm->data_ptr() : nullptr;
    p.x_len[i++] = static_cast<int>(x->size(1));
  }
  p.K = p.x_len[0] + p.x_len[1];
  p.batch = static_cast<int>(s.batch);
  p.eps = static_cast<float>(s.eps);
  p.epilogue = epilogue;
  return p;
}

void run_gemv_path(const DraftStep& s, at::Tensor& hidden_out, at::Tensor& ids, at::Tensor& logp) {
  const auto dtype = s.dtype;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Device dev = current_device();
  const int64_t B = s.batch, H = s.hidden_size, I = s.inter, qd = s.n_heads * s.head_dim;
  const auto opts = s.embeds.options();

  at::Tensor hid = s.fc ? at::empty({B, H}, opts) : s.hidden;
  at::Tensor q = at::empty({B, qd}, opts), attn = at::empty({B, qd}, opts);
  at::Tensor h1 = at::empty({B, H}, opts), act = at::empty({B, I}, opts);

  GemvParams fc{};
  if (s.fc) {
    fc = gemv(s, {&*s.fc}, {{&s.hidden, nullptr}}, cuda::kStore);
    fc.out = hid.data_ptr();
  }
  GemvParams qkv = gemv(s, {&s.q, &s.k, &s.v}, {{&s.embeds, &s.input_norm}, {&hid, &s.hidden_norm}}, cuda::kQkvRope);
  qkv.pair = static_cast<int>(s.head_dim / 2);
  qkv.qkv = qkv_out(s, q);
  GemvParams o = gemv(s, {&s.o}, {{&attn, nullptr}}, cuda::kResidual);
  o.out = h1.data_ptr();
  o.residual = hid.data_ptr();
  GemvParams gu = gemv(s, {&s.gate, &s.up}, {{&h1, &s.post_norm}}, cuda::kSiluMul);
  gu.pair = static_cast<int>(I);
  gu.out = act.data_ptr();
  GemvParams down = gemv(s, {&s.down}, {{&act, nullptr}}, cuda::kResidual);
  down.out = hidden_out.data_ptr();
  down.residual = h1.data_ptr();
  GemvParams lm = gemv(s, {&s.lm_head}, {{&hidden_out, &s.norm}}, cuda::kLogits);

  std::vector<GemvParams*> steps = {&qkv, &o, &gu, &down, &lm};
  if (s.fc) steps.insert(steps.begin(), &fc);
  int64_t part = 0, part_ss = 0, counters = 0;
  std::vector<int64_t> counter_at;
  for (GemvParams* p : steps) {
    const GemvWork w = cuda::plan_gemv(*p, dtype, dev.sms);
    part = std::max(part, w.part);
    part_ss = std::max(part_ss, w.part_ss);
    counter_at.push_back(counters);
    counters += w.counters;
  }
  AttnParams ap = attention_params(s, q, attn);
  const int attn_smem = cuda::plan_attention(ap, dtype, dev.sms, dev.smem_optin);
  const int64_t attn_o = B * s.n_heads * ap.n_split * s.head_dim, attn_ml = B * s.n_heads * ap.n_split * 2;
  const int64_t cands = static_cast<int64_t>(lm.n_tiles) * B * s.topk, tiles = static_cast<int64_t>(lm.n_tiles) * B;

  // One fp32 workspace, one int32 candidate buffer, one zeroed counter buffer per call.
  at::Tensor fws = at::empty({part + part_ss + attn_o + attn_ml + cands + 2 * tiles}, opts.dtype(at::kFloat));
  at::Tensor cand_idx = at::empty({cands}, opts.dtype(at::kInt));
  at::Tensor cnt = at::zeros({counters + B * s.n_kv}, opts.dtype(at::kInt));
  float* f = fws.data_ptr<float>();
  int* c = cnt.data_ptr<int>();
  for (size_t i = 0; i < steps.size(); ++i) {
    steps[i]->part = f;
    steps[i]->part_ss = f + part;
    steps[i]->counters = c + counter_at[i];
  }
  ap.part_o = f + part + part_ss;
  ap.part_ml = ap.part_o + attn_o;
  ap.counters = c + counters;
  TopkParts& tp = lm.topk;
  tp.topk = static_cast<int>(s.topk);
  tp.n_tiles = lm.n_tiles;
  tp.cand_val = ap.part_ml + attn_ml;
  tp.cand_idx = cand_idx.data_ptr<int>();
  tp.tile_max = tp.cand_val + cands;
  tp.tile_sum = tp.tile_max + tiles;

  if (s.fc) cuda::launch_gemv(fc, dtype, stream);
  cuda::launch_gemv(qkv, dtype, stream);
  cuda::launch_attention(ap, dtype, attn_smem, stream);
  cuda::launch_gemv(o, dtype, stream);
  cuda::launch_gemv(gu, dtype, stream);
  cuda::launch_gemv(down, dtype, stream);
  cuda::launch_gemv(lm, dtype, stream);
  cuda::launch_topk_merge(tp, static_cast<int>(B), s.d2t.data_ptr<int64_t>(), ids.data_ptr<int64_t>(),
                          logp.data_ptr<float>(), stream);
}

void run_cublas_path(const DraftStep& s, at::Tensor& hidden_out, at::Tensor& ids, at::Tensor& logp) {
  const auto dtype = s.dtype;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Device dev = current_device();
  const int B = static_cast<int>(s.batch), H = static_cast<int>(s.hidden_size);
  const float eps = static_cast<float>(s.eps);
  const auto opts = s.embeds.options();

  const at::Tensor hid = s.fc ? at::linear(s.hidden, *s.fc) : s.hidden;
  at::Tensor x = at::empty({B, 2 * H}, opts);
  cuda::launch_rms_norm(s.embeds.data_ptr(), s.input_norm.data_ptr(), x.data_ptr(), B, H, 2 * H, 0, eps, dtype,
                        stream);
  cuda::launch_rms_norm(hid.data_ptr(), s.hidden_norm.data_ptr(), x.data_ptr(), B, H, 2 * H, H, eps, dtype, stream);
  const at::Tensor qp = at::linear(x, s.q), kp = at::linear(x, s.k), vp = at::linear(x, s.v);
  at::Tensor q = at::empty_like(qp), attn = at::empty_like(qp);
  cuda::launch_rope_cache(qp.data_ptr(), kp.data_ptr(), vp.data_ptr(), qkv_out(s, q), B, dtype, stream);

  AttnParams ap = attention_params(s, q, attn);
  const int attn_smem = cuda::plan_attention(ap, dtype, dev.sms, dev.smem_optin);
  const int64_t attn_o = s.batch * s.n_heads * ap.n_split * s.head_dim;
  at::Tensor aws = at::empty({attn_o + s.batch * s.n_heads * ap.n_split * 2}, opts.dtype(at::kFloat));
  at::Tensor cnt = at::zeros({s.batch * s.n_kv}, opts.dtype(at::kInt));
  ap.part_o = aws.data_ptr<float>();
  ap.part_ml = ap.part_o + attn_o;
  ap.counters = cnt.data_ptr<int>();
  cuda::launch_attention(ap, dtype, attn_smem, stream);

  const at::Tensor h1 = hid + at::linear(attn, s.o);
  at::Tensor n1 = at::empty_like(h1);
  cuda::launch_rms_norm(h1.data_ptr(), s.post_norm.data_ptr(), n1.data_ptr(), B, H, H, 0, eps, dtype, stream);
  const at::Tensor act = at::silu(at::linear(n1, s.gate)) * at::linear(n1, s.up);
  at::add_out(hidden_out, h1, at::linear(act, s.down));
  at::Tensor f = at::empty_like(h1);
  cuda::launch_rms_norm(hidden_out.data_ptr(), s.norm.data_ptr(), f.data_ptr(), B, H, H, 0, eps, dtype, stream);
  const at::Tensor logits = at::linear(f, s.lm_head);

  TopkParts tp{};
  tp.topk = static_cast<int>(s.topk);
  tp.n_tiles = static_cast<int>((s.vocab + cuda::kTileRows - 1) / cuda::kTileRows);
  const int64_t cands = static_cast<int64_t>(tp.n_tiles) * B * s.topk, tiles = static_cast<int64_t>(tp.n_tiles) * B;
  at::Tensor tws = at::empty({cands + 2 * tiles}, opts.dtype(at::kFloat));
  at::Tensor cand_idx = at::empty({cands}, opts.dtype(at::kInt));
  tp.cand_val = tws.data_ptr<float>();
  tp.cand_idx = cand_idx.data_ptr<int>();
  tp.tile_max = tp.cand_val + cands;
  tp.tile_sum = tp.tile_max + tiles;
  cuda::launch_logits_parts(logits.data_ptr(), B, static_cast<int>(s.vocab), tp, dtype, stream);
  cuda::launch_topk_merge(tp, B, s.d2t.data_ptr<int64_t>(), ids.data_ptr<int64_t>(), logp.data_ptr<float>(), stream);
}

at::Tensor realigned(const at::Tensor& t) { return aligned16(t) ? t : t.clone(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> draft_step_cuda(
    const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& positions, at::Tensor& k_cache,
    at::Tensor& v_cache, const at::Tensor& cache_lens, const std::optional<at::Tensor>& fc_weight,
    const at::Tensor& input_norm_weight, const at::Tensor& hidden_norm_weight, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& v_weight, const at::Tensor& o_weight,
    const at::Tensor& post_norm_weight, const at::Tensor& gate_weight, const at::Tensor& up_weight,
    const at::Tensor& down_weight, const at::Tensor& norm_weight, const at::Tensor& lm_head_weight,
    const at::Tensor& d2t, double eps, const at::Tensor& rope_inv_freq, int64_t topk) {
  const c10::cuda::CUDAGuard guard(embeds.device());
  DraftStep s = make_draft_step(embeds, hidden, positions, k_cache, v_cache, cache_lens, fc_weight,
                                input_norm_weight, hidden_norm_weight, q_weight, k_weight, v_weight, o_weight,
                                post_norm_weight, gate_weight, up_weight, down_weight, norm_weight, lm_head_weight,
                                d2t, eps, rope_inv_freq, topk);
  check_cuda(s);
  s.embeds = realigned(s.embeds);
  s.hidden = realigned(s.hidden);
  const auto opts = s.embeds.options();
  at::Tensor hidden_out = at::empty({s.batch, s.hidden_size}, opts);
  at::Tensor ids = at::empty({s.batch, topk}, opts.dtype(at::kLong));
  at::Tensor logp = at::empty({s.batch, topk}, opts.dtype(at::kFloat));
  if (s.batch <= cuda::kMaxGemvBatch) {
    run_gemv_path(s, hidden_out, ids, logp);
  } else {
    run_cublas_path(s, hidden_out, ids, logp);
  }
  return {hidden_out, ids, logp};
}

}  // namespace

TORCH_LIBRARY_IMPL(drafter_lab, CUDA, m) {
  m.impl("draft_step", &draft_step_cuda);
}

}  // namespace drafter_lab::draft_forward
