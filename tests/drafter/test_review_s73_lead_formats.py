"""Session 73, lead: a falsy value of the wrong kind in a config.json field is refused, not read as absent."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError

CFG = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    draft_vocab_size=37, target_vocab_size=101, target_hidden_size=40, aux_layer_ids=[2, 4, 5],
                    rope_theta=500.0, rms_norm_eps=1e-5)


def _sc() -> dict:
    return formats.speculators_config(CFG, torch.float32)


@pytest.mark.parametrize("methods", [0, "", False, {}])
def test_falsy_proposal_methods_of_the_wrong_kind_are_one_line(methods):
    data = _sc()
    data["speculators_config"]["proposal_methods"] = methods
    with pytest.raises(LabError, match=rf"^c.json: config's 'proposal_methods' is {methods!r}, not a list"):
        formats.speculators_serving(data, "c.json")


def test_null_proposal_methods_read_as_none():
    data = _sc()
    data["speculators_config"]["proposal_methods"] = None
    assert "speculative_tokens" not in formats.speculators_serving(data, "c.json")


@pytest.mark.parametrize("archs", [0, "", False, {}, [""], ["LlamaForCausalLM", "  "]])
def test_verifier_architectures_falsy_or_blank_are_one_line(archs):
    data = _sc()
    data["speculators_config"]["verifier"] = {"name_or_path": "org/t", "architectures": archs}
    with pytest.raises(LabError, match=r"^c.json: config's verifier 'architectures' is .*, not a list of class names"):
        formats.speculators_serving(data, "c.json")


def test_null_verifier_architectures_read_as_none():
    data = _sc()
    data["speculators_config"]["verifier"] = {"name_or_path": "org/t", "architectures": None}
    assert formats.speculators_serving(data, "c.json", ("verifier",)) == {"verifier": "org/t"}


@pytest.mark.parametrize(("layer", "key"), [({"rope_scaling": 0}, "rope_scaling"), ({"rope_scaling": ""}, "rope_scaling"),
                                            ({"rope_scaling": []}, "rope_scaling"),
                                            ({"rope_parameters": False}, "rope_parameters"),
                                            ({"rope_scaling": {}, "rope_parameters": 0}, "rope_parameters")])
def test_rope_scaling_falsy_of_the_wrong_kind_is_one_line_naming_its_key(layer, key):
    with pytest.raises(LabError, match=rf"^c.json: {key} is not a JSON object"):
        formats.rope_scaling_of(layer, "c.json")


@pytest.mark.parametrize("layer", [{}, {"rope_scaling": None}, {"rope_scaling": {}}, {"rope_parameters": None},
                                   {"rope_scaling": None, "rope_parameters": {"rope_type": "default"}}])
def test_absent_null_or_empty_rope_scaling_is_plain_rope(layer):
    assert formats.rope_scaling_of(layer, "c.json") is None


def test_rope_parameters_are_read_when_rope_scaling_is_empty():
    layer = {"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}
    assert formats.rope_scaling_of(layer, "c.json") == {"rope_type": "linear", "factor": 2.0}
