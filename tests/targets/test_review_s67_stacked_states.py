"""A decoder whose hidden states stack several streams in front of the batch (Gemma 3n's AltUp,
[streams, batch, tokens, hidden]) is refused: read as [batch, tokens, hidden], stream 0 was taken for
sequence 0 and the rest for other sequences."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import hidden
from drafter_lab.targets.hidden import run_capturing


@pytest.fixture(scope="module")
def gemma3n():
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.for_model(
            "gemma3n_text", vocab_size=512, vocab_size_per_layer_input=512, hidden_size=64,
            hidden_size_per_layer_input=8, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, laurel_rank=8, num_kv_shared_layers=2,
            activation_sparsity_pattern=[0.0] * 8, layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2)
    except ValueError:
        pytest.skip("this transformers has no gemma3n_text")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("hooked", [True, False])
def test_stacked_streams_are_refused(gemma3n, hooked, monkeypatch):
    assert gemma3n(torch.tensor([[1, 2, 3]]), output_hidden_states=True).hidden_states[2].dim() == 4  # what this pins
    if not hooked:  # the output_hidden_states path, which models the hooks cannot read take
        monkeypatch.setattr(hidden, "decoder_layout", lambda model: None)
    with pytest.raises(LabError, match=r"^hidden state 2 of Gemma3nForCausalLM is \(4, 1, 3, 64\), not \[batch, tokens"):
        run_capturing(gemma3n, [2, 4, 5], input_ids=torch.tensor([[1, 2, 3]]))
