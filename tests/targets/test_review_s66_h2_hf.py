"""targets.hf behaviours no other test pinned (a mutation audit's survivors): the dtype a target loads and its
head is read in, a loaded target frozen in eval mode, the legacy fingerprint still naming it, layer 0 as an
aux id, the model class a config loads by, a tied head of a config transformers cannot build, the
embedding's width refused as the head's is, which weight a load refusal names, output_multiplier, every
drafter architecture refused as a target, a wrapper of its own code read by its text config, a tokenizer of
its own code, the progress bars a user disabled and the load report left shown, and the first line of a
multi-line error."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.errors import LabError
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint
from drafter_lab.targets.hf import (
    REMOTE_CODE_ENV,
    LogitMap,
    TargetHead,
    check_aux_layer_ids,
    check_loading_info,
    first_line,
    load_target,
    load_target_config,
    load_target_head,
    load_tokenizer,
    model_class,
    quiet_transformers,
)


@pytest.fixture(scope="module")
def bf16_llama(random_llama, tmp_path_factory) -> Path:
    """random_llama saved in bfloat16, as most released targets are."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("bf16") / "model"
    shutil.copytree(random_llama, out)
    AutoModelForCausalLM.from_pretrained(random_llama, dtype=torch.bfloat16).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return out


def test_a_bf16_target_loads_in_fp32_unless_asked_for_another_dtype(bf16_llama):
    # fp32 by default whatever the files hold: the lab's numbers (features, teacher logits) are fp32's.
    assert {p.dtype for p in load_target(bf16_llama, tokenizer=False).model.parameters()} == {torch.float32}
    assert {p.dtype for p in load_target(bf16_llama, dtype=torch.bfloat16, tokenizer=False).model.parameters()} \
        == {torch.bfloat16}


def test_a_bf16_targets_head_is_read_in_fp32(bf16_llama):
    head, stored = load_target_head(bf16_llama), load_file(str(bf16_llama / "model.safetensors"))
    assert head.embed_weight().dtype == head.lm_head_weight().dtype == torch.float32
    assert torch.equal(head.lm_head_weight(), stored["lm_head.weight"].float())


def test_a_loaded_target_is_frozen_and_in_eval_mode(random_llama):
    # Training a drafter against it must not build autograd graphs through it, nor drop out its states.
    model = load_target(random_llama, tokenizer=False).model
    assert not model.training and not any(m.training for m in model.modules())
    assert not any(p.requires_grad for p in model.parameters())


def test_features_named_by_the_legacy_fingerprint_still_name_the_target(random_llama):
    # Features and runs recorded before the fingerprint changed are this target's, not another's.
    head = load_target_head(random_llama)
    assert head.known_as(fingerprint(random_llama)) and head.known_as(legacy_fingerprint(random_llama))
    assert legacy_fingerprint(random_llama) != fingerprint(random_llama)
    assert not head.known_as(None) and not head.known_as("0" * 16)


def test_vocab_size_is_the_heads_rows(random_llama):
    # The logits' width, even where the embedding holds more rows (padded for a tensor-parallel split).
    head = load_target_head(random_llama)
    padded = TargetHead(head.path, head.config, torch.zeros(head.vocab_size + 64, head.hidden_size), head.lm_head,
                        head.fingerprint, head.architecture)
    assert padded.vocab_size == head.vocab_size == head.lm_head.shape[0]


def test_layer_0_is_an_aux_id_and_a_negative_one_is_out_of_range():
    # hidden_states[0] (the embedding's output) is what the engines capture before layer 0.
    assert check_aux_layer_ids([0, 3, 7], 8, "cfg") == [0, 3, 7]
    with pytest.raises(LabError, match=r"aux layer id\(s\) \[-1\] out of range"):
        check_aux_layer_ids([-1, 3, 7], 8, "cfg")


def test_a_model_with_a_causal_lm_class_loads_by_it_even_with_an_image_text_one():
    # Llama 4 (and Qwen 3.5) have both: the causal LM is the text model alone, without the vision tower's
    # weights; a model with only an image-text class (LLaVA) loads by that.
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        Llama4Config,
        LlamaConfig,
        LlavaConfig,
    )

    assert model_class(Llama4Config()) is AutoModelForCausalLM
    assert model_class(LlamaConfig()) is AutoModelForCausalLM
    assert model_class(LlavaConfig()) is AutoModelForImageTextToText


def _unbuildable(path: Path, tie: bool, tensors: dict) -> Path:
    """A config of a model_type transformers has no class for (its code is the model's own), and weights."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["OwnForCausalLM"], "model_type": "own_lm", "auto_map": {"AutoConfig": "x.OwnConfig"},
        "hidden_size": 16, "num_hidden_layers": 4, "vocab_size": 40, "tie_word_embeddings": tie}))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_a_tied_head_of_a_model_transformers_cannot_build_is_its_embedding(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTER_LAB_TRUST_REMOTE_CODE", raising=False)
    embed = torch.randn(40, 16)
    head = load_target_head(_unbuildable(tmp_path / "tied", True, {"model.embed_tokens.weight": embed}))
    assert torch.equal(head.lm_head_weight(), embed) and torch.equal(head.embed_weight(), embed)
    with pytest.raises(LabError, match="no lm_head.weight tensor, and the config does not tie it"):
        load_target_head(_unbuildable(tmp_path / "untied", False, {"model.embed_tokens.weight": embed}))


def test_an_embedding_of_another_width_than_hidden_size_is_refused(random_llama, tmp_path):
    # As the head's: the drafter embeds its tokens by it and would fail deep in its first layer.
    target = shutil.copytree(random_llama, tmp_path / "wide_embed")
    f = target / "model.safetensors"
    tensors = load_file(str(f))
    rows, hidden = tensors["model.embed_tokens.weight"].shape
    tensors["model.embed_tokens.weight"] = torch.zeros(rows, hidden + 8)
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(LabError, match=rf"embedding \({rows}, {hidden + 8}\) / lm_head .* do not match hidden_size"):
        load_target_head(target)


def test_a_load_refusal_names_the_first_weight_by_name_and_counts_the_rest():
    # transformers lists them in no fixed order: the message is the same on every run.
    with pytest.raises(LabError, match=r"^m: the weight files lack a\.weight and 2 more, which"):
        check_loading_info({"missing_keys": ["c.weight", "a.weight", "b.weight"]}, Path("m"))
    with pytest.raises(LabError, match=r"^m: tensor a has shape \(1, 2\) in the weight files, config.json gives "
                                       r"\(3, 2\) \(and 1 more\)$"):
        check_loading_info({"missing_keys": [], "mismatched_keys": [("b", (4,), (5,)), ("a", (1, 2), (3, 2))]},
                           Path("m"))
    check_loading_info({"unexpected_keys": ["model.layers.9.mtp.weight"]}, Path("m"))  # an MTP layer is fine


def test_output_multiplier_scales_the_logits_before_the_softcap():
    # Muse Spark multiplies its logits by output_multiplier, then caps them as Gemma 2 does.
    cfg = SimpleNamespace(output_multiplier=0.25, final_logit_softcapping=30.0)
    assert LogitMap.of(cfg) == LogitMap(0.25, 30.0)
    raw = torch.tensor([-400.0, 0.0, 8.0, 400.0])
    torch.testing.assert_close(LogitMap.of(cfg)(raw), 30.0 * torch.tanh(raw * 0.25 / 30.0))


def test_progress_bars_a_user_disabled_stay_disabled():
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_transformers():
            pass
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        if was:
            hf_logging.enable_progress_bar()


def test_a_first_line_ending_in_a_colon_goes_on_and_a_long_one_is_cut():
    e = ValueError("Unrecognized model. Should have a model_type key in one of:\n  llama\n  mistral\n")
    assert first_line(e) == "Unrecognized model. Should have a model_type key in one of: llama mistral"
    assert first_line(ValueError("first\nsecond")) == "first"
    assert first_line(ValueError("x" * 1000 + "\nmore")) == "x" * 300


def test_an_image_text_model_whose_config_names_no_architecture_is_named_alike_whole_or_by_its_head(tmp_path):
    # The head names the image-text wrapper transformers builds, as the whole model does: run.json records it.
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    cfg = LlavaConfig(text_config=dict(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                                       num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1),
                      vision_config=dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16),
                      image_token_index=63)
    path = tmp_path / "llava"
    LlavaForConditionalGeneration(cfg).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    del config["architectures"]
    (path / "config.json").write_text(json.dumps(config))
    head, full = load_target_head(path), load_target(path, tokenizer=False)
    assert head.architecture == full.architecture == "LlavaForConditionalGeneration"
    assert head.describe() == full.describe()


@pytest.mark.parametrize("arch", ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DraftModel",
                                  "Eagle3Speculator", "LlamaForCausalLMEagle", "EagleLlamaForCausalLM"])
def test_every_drafters_directory_is_refused_as_a_target(tmp_path, arch):
    # By name, listed here: a speculators export or an EAGLE(-2) drafter would load its one layer as a whole Llama.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": [arch]}))
    save_file({"lm_head.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LabError, match=rf"a drafter \({arch}\), not a target model"):
        load_target_config(tmp_path)


def test_a_wrapper_whose_config_transformers_does_not_know_is_read_by_its_text_config(tmp_path, monkeypatch):
    # Its config class is its own code (not run without the flag): the sizes are text_config's, not the wrapper's.
    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["OwnVLForConditionalGeneration"], "model_type": "own_vl",
        "auto_map": {"AutoConfig": "configuration_own.OwnVLConfig"}, "hidden_size": 99, "num_hidden_layers": 1,
        "text_config": {"model_type": "own_lm", "hidden_size": 16, "num_hidden_layers": 6, "vocab_size": 40,
                        "tie_word_embeddings": False, "logits_scaling": 4.0}}))
    embed, lm_head = torch.randn(40, 16), torch.randn(40, 16)
    save_file({"language_model.model.embed_tokens.weight": embed, "language_model.lm_head.weight": lm_head},
              str(tmp_path / "model.safetensors"))
    head = load_target_head(tmp_path)
    assert (head.architecture, head.num_layers, head.hidden_size, head.logit_map) == \
        ("OwnVLForConditionalGeneration", 6, 16, LogitMap(0.25))
    assert torch.equal(head.embed_weight(), embed) and torch.equal(head.lm_head_weight(), lm_head)


TOKENIZER_CODE = """from transformers import PreTrainedTokenizerFast


class OwnTokenizer(PreTrainedTokenizerFast):
    own = True
"""


def test_a_tokenizer_of_its_own_code_needs_the_flag_and_loads_with_it(random_llama, tmp_path, monkeypatch):
    # Kimi K2's tokenizer is its own code: a one-line refusal naming the flag without it, its own class with it.
    out = shutil.copytree(random_llama, tmp_path / "own_tok")
    (out / "tokenization_own.py").write_text(TOKENIZER_CODE)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class="OwnTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_own.OwnTokenizer"]})
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr("builtins.input", lambda prompt="": pytest.fail(f"asked on the terminal: {prompt}"))
    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    with pytest.raises(LabError, match=r"its tokenizer needs the model's own code \(config.json's auto_map\): pass "
                                       r"--trust-remote-code"):
        load_tokenizer(out)
    monkeypatch.setenv(REMOTE_CODE_ENV, "1")
    tok = load_tokenizer(out)
    assert type(tok).__name__ == "OwnTokenizer" and tok.own
    assert tok("def f():").input_ids == load_tokenizer(random_llama)("def f():").input_ids


def test_the_load_report_shows_unless_asked_to_hide_it():
    # Only load_target and capture judge the report's keys themselves; other loads keep transformers' word.
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    report = logging.getLogger("transformers.modeling_utils")
    report.addHandler(handler)
    try:
        with quiet_transformers():
            report.warning("LOAD REPORT from_pretrained")
    finally:
        report.removeHandler(handler)
    assert seen == ["LOAD REPORT from_pretrained"]
