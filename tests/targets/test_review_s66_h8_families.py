"""The lab's LogitMap against the logits each family's own model makes: RecurrentGemma (`logits_soft_cap`) and
xLSTM (`output_logit_soft_cap`) cap them under names of their own, which the lab read as no cap; MPT's config
carries a `logit_scale` that neither transformers nor vLLM applies, which the lab multiplied by."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.targets.hf import LogitMap, load_target_head

IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, vocab_size=96)

FAMILIES = [
    ("recurrent_gemma", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, logits_soft_cap=0.5), LogitMap(1.0, 0.5)),
    ("xlstm", dict(hidden_size=64, num_hidden_layers=2, num_heads=4, output_logit_soft_cap=0.5), LogitMap(1.0, 0.5)),
    ("mpt", dict(d_model=64, n_layers=2, n_heads=4, logit_scale=4.0), LogitMap()),
]


@pytest.mark.parametrize("model_type, fields, expected", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_logit_map_matches_the_family_own_logits(tmp_path, model_type, fields, expected):
    transformers = pytest.importorskip("transformers")
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **IDS, **fields)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(tmp_path)
    head = load_target_head(tmp_path)
    assert head.logit_map == expected
    with torch.no_grad():
        out = model(torch.randint(3, 96, (1, 12)), output_hidden_states=True, use_cache=False)
    torch.testing.assert_close(head.logit_map(out.hidden_states[-1][0] @ head.lm_head_weight().T), out.logits[0],
                               rtol=1e-5, atol=1e-5)
