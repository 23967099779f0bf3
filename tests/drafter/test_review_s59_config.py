"""DrafterConfig.for_target reads the target's RoPE base under transformers 5, whose configs hold it in
`rope_parameters`, nested by layer type where the layers differ (Gemma 3, OLMo 3)."""

from __future__ import annotations

import pytest
import transformers

from drafter_lab.drafter.config import DrafterConfig

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 128, "num_hidden_layers": 6, "vocab_size": 100}


@pytest.mark.parametrize(("cls", "fields", "theta"), [
    # a hub config.json as transformers 4 wrote it: one rope_theta, nested per layer type on reading
    ("Olmo3Config", {"rope_theta": 500000.0, "sliding_window": 16}, 500000.0),
    # Gemma 3: the global layers' base; the sliding ones use rope_local_base_freq
    ("Gemma3TextConfig", {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 1000000.0),
    ("LlamaConfig", {"rope_theta": 500000.0}, 500000.0),  # flat rope_parameters, as before
])
def test_the_drafter_takes_the_targets_rope_theta_from_nested_rope_parameters(cls, fields, theta):
    config = getattr(transformers, cls)(**SMALL, **fields)
    assert DrafterConfig.for_target(config, 10, [1, 2, 3]).rope_theta == theta
