"""HyperCLOVA X's `logits_scaling` multiplies its logits (MuP), where Granite's divides them: its teacher
took a distribution 1/s**2 as sharp as the one it samples from (16x too flat for a scaling of 4)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from drafter_lab.targets.hf import LogitMap, load_target_head

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def test_hyperclovax_multiplies_by_its_logits_scaling(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "HyperCLOVAXConfig"):
        pytest.skip("this transformers has no HyperCLOVA X")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.HyperCLOVAXConfig(**SMALL, logits_scaling=4.0))
    model.eval().save_pretrained(tmp_path)
    head = load_target_head(tmp_path)
    assert head.logit_map == LogitMap(4.0)
    with torch.no_grad():
        out = model(torch.randint(0, 96, (1, 12)), output_hidden_states=True)
    torch.testing.assert_close(head.logit_map(out.hidden_states[-1][0] @ head.lm_head_weight().T), out.logits[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type, scale", [("hyperclovax", 8.0), ("granite", 1 / 8), ("minicpm3", 1 / 8)])
def test_logits_scaling_as_each_family_applies_it(model_type, scale):
    # An int, as a hand-written config.json may give it; MiniCPM3 divides the final states by it, as Granite does.
    assert LogitMap.of(SimpleNamespace(model_type=model_type, logits_scaling=8)) == LogitMap(scale)
