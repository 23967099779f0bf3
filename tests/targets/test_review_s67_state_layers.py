"""A target whose num_hidden_layers is not its hidden-state layer count (LongCat-Flash's counts two
sublayers in each of its num_layers layers): the default aux layers were picked from twice the count,
past the end of its hidden states, and the capture fell back to keeping every state."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.targets import hidden
from drafter_lab.targets.hf import default_aux_layer_ids, load_target, load_target_head


@pytest.fixture(scope="module")
def longcat(tmp_path_factory):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.for_model(
            "longcat_flash", vocab_size=512, hidden_size=64, num_layers=8, num_attention_heads=4, num_key_value_heads=4,
            ffn_hidden_size=128, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8,
            v_head_dim=16, moe_topk=2, n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=32)
    except ValueError:
        pytest.skip("this transformers has no longcat_flash")
    assert cfg.num_hidden_layers == 16  # what this pins: the field says twice the layers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    if getattr(hidden._recorder(MODEL_MAPPING[type(cfg)]), "num_hidden_layers_key", None) is None:
        pytest.skip(f"transformers {transformers.__version__} records no layer-count key for its hidden states")
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("longcat")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    return out


def test_the_layer_count_is_the_hidden_states(longcat):
    target = load_target(longcat, tokenizer=False)
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        states = target.model(x, output_hidden_states=True).hidden_states
    assert target.num_layers == load_target_head(longcat).num_layers == len(states) - 1 == 8
    ids = default_aux_layer_ids(target.num_layers)
    with torch.no_grad():
        _, kept = hidden.run_capturing(target.model, ids, input_ids=x)
    assert all(torch.equal(kept[i], states[i]) for i in [*ids, -1])


def test_the_capture_reads_it_by_hooks(longcat, monkeypatch):
    """Not by keeping every state: the layer count matched no decoder layout."""
    target = load_target(longcat, tokenizer=False)
    monkeypatch.setattr(hidden, "_run_whole", lambda *a: pytest.fail("kept every hidden state"))
    hidden.run_capturing(target.model, [2, 4, 5], input_ids=torch.tensor([[1, 2, 3]]))
