"""measure_drift refuses two models of different depth, rather than comparing the first layers of each
as if they were the same ones."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.targets.drift import CkaMoments, measure_drift


def _llama(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=53, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def test_models_of_different_depth_are_refused():
    ids = [torch.randint(0, 53, (2, 9), generator=torch.Generator().manual_seed(0))]
    with pytest.raises(ValueError, match="different numbers of layers"):
        measure_drift(_llama(4), _llama(3), ids)
    assert len(measure_drift(_llama(3), _llama(3), ids)["cka"]) == 4


def test_no_batch_is_refused():
    with pytest.raises(ValueError, match="at least one batch"):
        measure_drift(_llama(2), _llama(2), [])


def test_rows_of_more_than_two_dims_are_refused():
    x = torch.randn(5, 3, 2)
    with pytest.raises(ValueError, match=r"need paired rows \[N, D1\] and \[N, D2\], got \(5, 3, 2\)"):
        CkaMoments().update(x, x)
