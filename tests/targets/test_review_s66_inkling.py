"""Inkling divides its final states by `logits_mup_width_multiplier` (24 by default) before its head: the
teacher took logits 24 times too sharp."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.targets.hf import LogitMap, load_target_head


def test_inkling_divides_by_its_mup_width_multiplier(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "InklingTextConfig"):
        pytest.skip("this transformers has no Inkling")
    config = transformers.InklingTextConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=8,
        intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, d_rel=4, rel_extent=16, max_position_embeddings=64, tie_word_embeddings=False,
        logits_mup_width_multiplier=4.0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    head = load_target_head(tmp_path)
    assert head.logit_map == LogitMap(0.25)
    with torch.no_grad():
        out = model(torch.randint(0, 96, (1, 12)), output_hidden_states=True)
    torch.testing.assert_close(head.logit_map(out.hidden_states[-1][0] @ head.lm_head_weight().T), out.logits[0],
                               rtol=1e-5, atol=1e-5)
