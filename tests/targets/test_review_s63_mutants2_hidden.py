"""run_capturing at the edges of its index range and on a decoder that skips a layer (mutation audit, round 2)."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from drafter_lab.errors import LabError
from drafter_lab.targets.hidden import run_capturing


def _llama():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                        num_key_value_heads=1, max_position_embeddings=64)
    return T.LlamaForCausalLM(cfg).eval()


def test_the_most_negative_index_is_state_0_as_on_the_full_tuple():
    """-(L+1) names hidden_states[0] on HF's tuple; it is in range here too."""
    model = _llama()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        want = model(ids, output_hidden_states=True).hidden_states
        _, hs = run_capturing(model, [-len(want)], input_ids=ids)
    assert torch.equal(hs[0], want[0]) and torch.equal(hs[-len(want)], want[0])


class _SkippingDecoder(nn.Module):
    """A decoder laid out as the hooks read (`layers` of num_hidden_layers) whose forward passes one by."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.config = types.SimpleNamespace(num_hidden_layers=3)

    def forward(self, x):
        for layer in (self.layers[0], self.layers[2]):  # layer 1 never runs
            x = layer(x)
        return (x,)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _SkippingDecoder()

    def forward(self, x, output_hidden_states=False):
        return self.model(x)


def test_a_state_whose_layer_never_ran_is_an_error_not_an_index_error():
    with pytest.raises(LabError, match="hidden state 2 was seen 0 times"), torch.no_grad():
        run_capturing(_Model(), [2], x=torch.ones(1, 2, 4))
