"""What a hand-written config.json may hold. A logit scale or cap of NaN or Infinity (Python's json reads
both) is refused in one line naming the file: taken as given it made every teacher logit NaN, found only at
train's first non-finite loss. A stop id of true or -1 is no token."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import SOFTCAP_KEYS, LogitMap, load_target_head, stop_token_ids


@pytest.mark.parametrize("key", ["logits_scaling", "logit_scale", "lm_head_multiplier", "output_multiplier",
                                 "logits_mup_width_multiplier", *SOFTCAP_KEYS])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_scale_or_cap_that_is_no_finite_number_is_refused(key, value):
    with pytest.raises(LabError, match=rf"^cfg.json: {key} is {value}, not a finite number$"):
        LogitMap.of(SimpleNamespace(model_type="granite", **{key: value}), where="cfg.json")


def test_an_unused_logit_scale_is_not_read():
    """MPT's config carries a logit_scale its class never applies: whatever it holds, nothing to refuse."""
    assert LogitMap.of(SimpleNamespace(model_type="mpt", logit_scale=math.nan)) == LogitMap()


def test_a_target_whose_config_json_holds_nan_names_that_file(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GraniteConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                        logits_scaling=4.0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    assert load_target_head(tmp_path).logit_map == LogitMap(0.25)
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, "logits_scaling": math.nan}))  # json writes NaN
    head = load_target_head(tmp_path)
    with pytest.raises(LabError, match=rf"^{tmp_path / 'config.json'}: logits_scaling is nan, not a finite number$"):
        _ = head.logit_map


def test_a_stop_id_that_is_no_token_id_is_not_taken():
    """`"eos_token_id": true` in a hand-written config read as id 1, and -1 as the last row's id."""
    text = SimpleNamespace(eos_token_id=None)
    config = SimpleNamespace(eos_token_id=True, get_text_config=lambda: text)
    model = SimpleNamespace(config=config, generation_config=SimpleNamespace(eos_token_id=[-1, 9, False]))
    target = SimpleNamespace(model=model, tokenizer=SimpleNamespace(eos_token_id=2))
    assert stop_token_ids(target) == [2, 9]
