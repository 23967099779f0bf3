"""Session 71, helper 4: mutation audit of drafter/formats.py (config.json reading)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError

CFG = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    draft_vocab_size=37, target_vocab_size=101, target_hidden_size=40, aux_layer_ids=[2, 4, 5],
                    rope_theta=500.0, rms_norm_eps=1e-5)


def _speculators(**over) -> dict:
    return {**formats.speculators_config(CFG, torch.float32), **over}


def test_proposal_methods_that_are_not_objects_are_one_line():
    # a list of numbers is a list, but not of objects: read as one, its first would raise AttributeError
    data = _speculators()
    data["speculators_config"]["proposal_methods"] = [5]
    with pytest.raises(LabError, match=r"cfg.json: config's 'proposal_methods' is \[5\], not a list of JSON objects"):
        formats.speculators_serving(data, "cfg.json")


@pytest.mark.parametrize("methods", [[], [{"proposal_type": "greedy"}], [{"proposal_type": "greedy",
                                                                         "speculative_tokens": None}]])
def test_a_file_without_a_draft_length_leaves_it_unset(methods):
    data = _speculators()
    data["speculators_config"]["proposal_methods"] = methods
    assert "speculative_tokens" not in formats.speculators_serving(data, "cfg.json")


@pytest.mark.parametrize("verifier, want", [
    ({"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]},
     {"verifier": "org/target", "verifier_architectures": ("LlamaForCausalLM",)}),
    ({"name_or_path": "org/target"}, {"verifier": "org/target"}),
    ({"architectures": None}, {}),
])
def test_the_verifier_and_its_architectures_are_read_as_given(verifier, want):
    data = _speculators()
    data["speculators_config"]["verifier"] = verifier
    assert formats.speculators_serving(data, "cfg.json", ("verifier",)) == want


def _refusal(data) -> str:
    with pytest.raises(LabError) as e:
        formats.parse_config(data, "cfg.json")
    return str(e.value).removeprefix("cfg.json: ")


@pytest.mark.parametrize("over, says", [
    # a drafter's name is a drafter's, however many layers it claims: refused as one, not as a target model
    ({"num_hidden_layers": 2}, "drafter has 2 layers; EAGLE-3 here has exactly one midlayer"),
    ({"architectures": [5], "num_hidden_layers": 2}, "config's 'architectures' is [5], not a list of class names"),
])
def test_a_drafter_config_is_not_taken_for_a_target_model(over, says):
    assert _refusal({**formats.sglang_config(CFG, torch.float32), **over}) == says
