// Argument checking shared by the CPU and CUDA implementations of drafter_lab::draft_step.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace drafter_lab::draft_forward {

// The tensors of one draft step, in schema order, and the sizes read off their shapes.
struct DraftStep {
  at::Tensor embeds, hidden, positions, k_cache, v_cache, cache_lens;
  std::optional<at::Tensor> fc;
  at::Tensor input_norm, hidden_norm, q, k, v, o, post_norm, gate, up, down, norm, lm_head, d2t;
  double eps;
  at::Tensor rope_inv_freq;
  int64_t topk;

  int64_t batch, hidden_size, n_heads, n_kv, head_dim, cache_size, inter, vocab;
  at::ScalarType dtype;
};

inline void check_matrix(const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, "draft_step: ", name,
              " has shape ", t.sizes(), ", want [", rows, ", ", cols, "]");
}

inline void check_vector(const at::Tensor& t, const char* name, int64_t n) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, "draft_step: ", name, " has shape ", t.sizes(),
              ", want [", n, "]");
}

// Checks shapes, dtypes and devices; makes activations contiguous (weights and caches must be).
inline DraftStep make_draft_step(
    const at::Tensor& embeds, const at::Tensor& hidden, const at::Tensor& positions,
    const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& cache_lens,
    const std::optional<at::Tensor>& fc_weight, const at::Tensor& input_norm_weight,
    const at::Tensor& hidden_norm_weight, const at::Tensor& q_weight, const at::Tensor& k_weight,
    const at::Tensor& v_weight, const at::Tensor& o_weight, const at::Tensor& post_norm_weight,
    const at::Tensor& gate_weight, const at::Tensor& up_weight, const at::Tensor& down_weight,
    const at::Tensor& norm_weight, const at::Tensor& lm_head_weight, const at::Tensor& d2t,
    double eps, const at::Tensor& rope_inv_freq, int64_t topk) {
  TORCH_CHECK(embeds.dim() == 2, "draft_step: embeds must be [B, H], got ", embeds.sizes());
  const auto dtype = embeds.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "draft_step: dtype must be float32, bfloat16 or float16, got ", dtype);
  DraftStep s{embeds.contiguous(), hidden.contiguous(), positions.contiguous(), k_cache, v_cache,
              cache_lens.contiguous(), fc_weight, input_norm_weight, hidden_norm_weight, q_weight,
              k_weight, v_weight, o_weight, post_norm_weight, gate_weight, up_weight, down_weight,
              norm_weight, lm_head_weight, d2t, eps, rope_inv_freq, topk};
  s.dtype = dtype;
  s.batch = embeds.size(0);
  s.hidden_size = embeds.size(1);
  TORCH_CHECK(k_cache.dim() == 4, "draft_step: k_cache must be [B, n_kv, S, head_dim], got ",
              k_cache.sizes());
  s.n_kv = k_cache.size(1);
  s.cache_size = k_cache.size(2);
  s.head_dim = k_cache.size(3);
  TORCH_CHECK(s.batch >= 1 && s.hidden_size >= 1, "draft_step: empty batch or hidden size");
  TORCH_CHECK(s.n_kv >= 1 && s.cache_size >= 1 && s.head_dim >= 2 && s.head_dim % 2 == 0,
              "draft_step: k_cache ", k_cache.sizes(), " needs n_kv, S >= 1 and an even head_dim");
  TORCH_CHECK(k_cache.size(0) == s.batch, "draft_step: k_cache batch ", k_cache.size(0),
              " != embeds batch ", s.batch);
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "draft_step: v_cache ", v_cache.sizes(),
              " != k_cache ", k_cache.sizes());
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "draft_step: k_cache and v_cache must be contiguous (they are written in place)");
  const int64_t h2 = 2 * s.hidden_size;
  TORCH_CHECK(q_weight.dim() == 2 && q_weight.size(0) % s.head_dim == 0,
              "draft_step: q_weight rows ", q_weight.sizes(), " must be a multiple of head_dim ",
              s.head_dim);
  s.n_heads = q_weight.size(0) / s.head_dim;
  TORCH_CHECK(s.n_heads % s.n_kv == 0, "draft_step: ", s.n_heads, " query heads are not a multiple of ",
              s.n_kv, " kv heads");
  s.inter = gate_weight.dim() == 2 ? gate_weight.size(0) : -1;
  s.vocab = lm_head_weight.dim() == 2 ? lm_head_weight.size(0) : -1;
  check_matrix(q_weight, "q_weight", s.n_heads * s.head_dim, h2);
  check_matrix(k_weight, "k_weight", s.n_kv * s.head_dim, h2);
  check_matrix(v_weight, "v_weight", s.n_kv * s.head_dim, h2);
  check_matrix(o_weight, "o_weight", s.hidden_size, s.n_heads * s.head_dim);
  check_matrix(gate_weight, "gate_weight", s.inter, s.hidden_size);
  check_matrix(up_weight, "up_weight", s.inter, s.hidden_size);
  check_matrix(down_weight, "down_weight", s.hidden_size, s.inter);
  check_matrix(lm_head_weight, "lm_head_weight", s.vocab, s.hidden_size);
  check_vector(input_norm_weight, "input_norm_weight", s.hidden_size);
  check_vector(hidden_norm_weight, "hidden_norm_weight", s.hidden_size);
  check_vector(post_norm_weight, "post_norm_weight", s.hidden_size);
  check_vector(norm_weight, "norm_weight", s.hidden_size);
  check_vector(d2t, "d2t", s.vocab);
  check_vector(positions, "positions", s.batch);
  check_vector(cache_lens, "cache_lens", s.batch);
  check_vector(rope_inv_freq, "rope_inv_freq", s.head_dim / 2);
  TORCH_CHECK(rope_inv_freq.scalar_type() == at::kFloat && rope_inv_freq.is_contiguous(),
              "draft_step: rope_inv_freq must be a contiguous float32 vector, got ", rope_inv_freq.scalar_type());
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) == s.batch, "draft_step: hidden must be [B, *], got ",
              hidden.sizes());
  if (fc_weight) {
    check_matrix(*fc_weight, "fc_weight", s.hidden_size, hidden.size(1));
  } else {
    TORCH_CHECK(hidden.size(1) == s.hidden_size, "draft_step: hidden width ", hidden.size(1),
                " != H ", s.hidden_size, " and no fc_weight was given");
  }
  TORCH_CHECK(topk >= 1 && topk <= s.vocab, "draft_step: topk ", topk, " outside [1, ", s.vocab, "]");
  TORCH_CHECK(d2t.scalar_type() == at::kLong, "draft_step: d2t must be int64, got ", d2t.scalar_type());
  for (const at::Tensor* t : {&positions, &cache_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong || t->scalar_type() == at::kInt,
                "draft_step: positions and cache_lens must be int32 or int64, got ", t->scalar_type());
  }
  const at::Tensor* same_dtype[] = {&hidden, &k_cache, &v_cache, &input_norm_weight, &hidden_norm_weight,
                                    &q_weight, &k_weight, &v_weight, &o_weight, &post_norm_weight,
                                    &gate_weight, &up_weight, &down_weight, &norm_weight, &lm_head_weight};
  for (const at::Tensor* t : same_dtype) {
    TORCH_CHECK(t->scalar_type() == dtype, "draft_step: every activation, cache and weight must be ",
                dtype, "; found ", t->scalar_type());
  }
  if (fc_weight) {
    TORCH_CHECK(fc_weight->scalar_type() == dtype, "draft_step: fc_weight must be ", dtype);
  }
  const at::Tensor* weights[] = {&input_norm_weight, &hidden_norm_weight, &q_weight, &k_weight, &v_weight,
                                 &o_weight, &post_norm_weight, &gate_weight, &up_weight, &down_weight,
                                 &norm_weight, &lm_head_weight, &d2t};
  for (const at::Tensor* t : weights) {
    TORCH_CHECK(t->is_contiguous(), "draft_step: weights must be contiguous");
  }
  TORCH_CHECK(!fc_weight || fc_weight->is_contiguous(), "draft_step: fc_weight must be contiguous");
  const auto device = embeds.device();
  const at::Tensor* all[] = {&hidden, &positions, &k_cache, &v_cache, &cache_lens, &input_norm_weight,
                             &hidden_norm_weight, &q_weight, &k_weight, &v_weight, &o_weight,
                             &post_norm_weight, &gate_weight, &up_weight, &down_weight, &norm_weight,
                             &lm_head_weight, &d2t, &rope_inv_freq};
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->device() == device, "draft_step: all tensors must be on ", device, "; found one on ",
                t->device());
  }
  TORCH_CHECK(!fc_weight || fc_weight->device() == device, "draft_step: fc_weight must be on ", device);
  return s;
}

}  // namespace drafter_lab::draft_forward
