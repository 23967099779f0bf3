// Schemas of every drafter_lab torch op. CPU and CUDA implementations register against them with
// TORCH_LIBRARY_IMPL next to their code; fake (meta) kernels for torch.compile are registered in
// Python when drafter_lab/kernels/draft_step.py is imported; set_python_module makes torch's error
// for a missing fake kernel name that module.
#include <torch/library.h>

TORCH_LIBRARY(drafter_lab, m) {
  m.set_python_module("drafter_lab.kernels.draft_step");
  // One EAGLE-3 draft step (DESIGN section 4): optional fc over the three aux states, both
  // RMSNorms and the concat, q/k/v with RoPE, attention over the KV cache (this step's k/v written
  // in place at cache_lens[b]; the row attends to entries 0..cache_lens[b]), o_proj + residual,
  // post_attention_layernorm, SwiGLU + residual, final norm, lm_head, log_softmax and top-k.
  // rope_inv_freq [head_dim / 2] fp32 holds the RoPE frequencies, scaled as the drafter's config says.
  // Head counts come from the shapes: head_dim = k_cache.size(3), kv heads = k_cache.size(1),
  // query heads = q_weight.size(0) / head_dim. Returns (hidden_out [B,H] pre-norm, top-k target
  // ids [B,topk] int64 mapped through d2t, their log-probs over the draft vocab [B,topk] fp32).
  m.def(
      "draft_step(Tensor embeds, Tensor hidden, Tensor positions, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor cache_lens, Tensor? fc_weight, Tensor input_norm_weight, "
      "Tensor hidden_norm_weight, Tensor q_weight, Tensor k_weight, Tensor v_weight, "
      "Tensor o_weight, Tensor post_norm_weight, Tensor gate_weight, Tensor up_weight, "
      "Tensor down_weight, Tensor norm_weight, Tensor lm_head_weight, Tensor d2t, float eps, "
      "Tensor rope_inv_freq, int topk) -> (Tensor, Tensor, Tensor)");
}
