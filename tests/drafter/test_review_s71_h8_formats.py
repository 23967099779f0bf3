"""Session 71, helper 8: formats.py config reading (null fields, a head_dim of 0) and its mutation audit."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError

CFG = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    draft_vocab_size=37, target_vocab_size=101, target_hidden_size=40, aux_layer_ids=[2, 4, 5],
                    rope_theta=500.0, rms_norm_eps=1e-5)


def _sglang(**over) -> dict:
    return {**formats.sglang_config(CFG, torch.float32), **over}


def _refusal(data) -> str:
    with pytest.raises(LabError) as e:
        formats.parse_config(data, "config.json")
    return str(e.value)


# HF configs write null for a field they leave unset: read as absent, as every other field is
@pytest.mark.parametrize("over", [{"hidden_act": None}, {"logit_scale": None}, {"num_hidden_layers": None}])
def test_a_null_field_reads_as_absent(over):
    assert formats.parse_config(_sglang(**over), "config.json") == (CFG, formats.SGLANG)


def test_a_null_field_in_a_speculators_layer_reads_as_absent():
    data = formats.speculators_config(CFG, torch.float32)
    data["transformer_layer_config"].update(hidden_act=None, num_hidden_layers=None)
    assert formats.parse_config(data, "config.json") == (CFG, formats.SPECULATORS)


def test_a_target_with_a_null_top_level_layer_count_is_still_a_target():
    # a multimodal model's count lives in its text_config: a null beside it does not hide it
    data = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": None,
            "text_config": {**_sglang(), "architectures": None, "num_hidden_layers": 8}}
    data = {**data, **{k: v for k, v in _sglang().items() if k not in data}}
    assert "a target model (LlamaForCausalLM, 8 layers)" in _refusal(data)


@pytest.mark.parametrize("over, says", [
    ({"hidden_act": "gelu"}, "drafter hidden_act 'gelu' is not supported"),
    ({"logit_scale": 0.5}, "drafter logit_scale 0.5 is not supported"),
    ({"logit_scale": "1.0"}, "config's 'logit_scale' is '1.0', not a number"),
    ({"num_hidden_layers": 2}, "drafter has 2 layers"),
    ({"num_hidden_layers": "1"}, "config's 'num_hidden_layers' is '1', not an integer"),
    # true == 1: read as a number it would pass the 1.0 and one-layer checks
    ({"logit_scale": True}, "config's 'logit_scale' is True, not a number"),
    ({"num_hidden_layers": True}, "config's 'num_hidden_layers' is True, not an integer"),
])
def test_a_field_that_is_set_is_still_checked(over, says):
    assert says in _refusal(_sglang(**over))


@pytest.mark.parametrize("head_dim", [None, "absent"])
def test_fewer_hidden_units_than_heads_without_a_head_dim_is_one_line(head_dim):
    # hidden_size // num_attention_heads would be a head_dim of 0: zero-width heads, a NaN softmax scale
    data = _sglang(hidden_size=2, head_dim=head_dim)
    if head_dim == "absent":
        del data["head_dim"]
    assert _refusal(data) == ("config.json: config's hidden_size 2 is smaller than its num_attention_heads 4, so "
                              "head_dim cannot default to hidden_size // num_attention_heads: give head_dim")


def test_fewer_hidden_units_than_heads_with_a_head_dim_is_read():
    cfg, _ = formats.parse_config(_sglang(hidden_size=2), "config.json")
    assert (cfg.hidden_size, cfg.head_dim) == (2, 16)


def test_as_many_hidden_units_as_heads_gives_a_head_dim_of_1():
    # the boundary of the check above: hidden_size // heads is 1 here, refused as odd, not as 0
    data = {k: v for k, v in _sglang(hidden_size=4).items() if k != "head_dim"}
    assert _refusal(data) == "config.json: config's head_dim 1 is odd: RoPE needs an even one"


@pytest.mark.parametrize("archs", ["LlamaForCausalLM", 5])
def test_verifier_architectures_that_are_not_a_list_are_one_line(archs):
    # a string would be read letter by letter as class names, a number would raise TypeError
    data = formats.speculators_config(CFG, torch.float32, verifier="org/target")
    data["speculators_config"]["verifier"]["architectures"] = archs
    with pytest.raises(LabError, match=rf"^config.json: config's verifier 'architectures' is {archs!r}, not a list"):
        formats.speculators_serving(data, "config.json")


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "vocab_size"])
def test_a_required_size_that_is_absent_or_null_is_one_line(key):
    # without a default, None must not pass through into DrafterConfig
    for data in ({k: v for k, v in _sglang().items() if k != key}, _sglang(**{key: None})):
        assert _refusal(data) == f"config.json: config lacks {key!r}"


def test_a_draft_vocabulary_larger_than_the_targets_is_one_line():
    # each draft id names a distinct target token: 102 of 101 cannot be a subset
    assert _refusal(_sglang(draft_vocab_size=102)) == (
        "config.json: config's draft_vocab_size 102 is larger than its vocab_size 101: a draft vocabulary is a subset "
        "of the target's")
    assert formats.parse_config(_sglang(draft_vocab_size=101), "config.json")[0].draft_vocab_size == 101
