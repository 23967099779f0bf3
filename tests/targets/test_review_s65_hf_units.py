"""targets.hf's small rules no other test reached: aux ids are three, below the final norm; the tokenizer's
top id may not equal the embedding's row count; the pad and stop ids; the remote-code flag's spellings and
its refusal only where it is not given; the text config of InternVL's and DeepSeek-VL's wrappers; the
first line of an exception with no message."""

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
from drafter_lab.targets.hf import (
    DEFAULT_CHAT_TEMPLATE,
    MODEL_JSON,
    REMOTE_CODE_ENV,
    Target,
    _stored_name,
    broken_file,
    check_aux_layer_ids,
    check_shards,
    first_line,
    load_target,
    load_target_config,
    load_target_head,
    load_tokenizer,
    pad_token_id,
    quiet_transformers,
    remote_code_refusal,
    stop_token_ids,
    text_model_fields,
    trusts_remote_code,
)


def test_more_than_three_aux_ids_are_refused():
    with pytest.raises(LabError, match=r"need exactly 3 aux layer ids, got \[1, 2, 3, 4\]"):
        check_aux_layer_ids([1, 2, 3, 4], 8, "cfg")


def test_the_final_norms_index_is_no_aux_id():
    # hidden_states[L] is the final norm's output, which no serving engine captures.
    assert check_aux_layer_ids([1, 4, 7], 8, "cfg") == [1, 4, 7]
    with pytest.raises(LabError, match=r"aux layer id\(s\) \[8\] out of range"):
        check_aux_layer_ids([1, 4, 8], 8, "cfg")


def test_a_tokenizer_one_id_past_the_embedding_is_refused(random_llama, tmp_path):
    target = shutil.copytree(random_llama, tmp_path / "grown")
    tok = load_tokenizer(target)
    rows = load_target(random_llama).model.get_input_embeddings().num_embeddings
    assert max(tok.vocab_size - 1, max(tok.added_tokens_decoder)) == rows - 1
    tok.add_special_tokens({"additional_special_tokens": ["[THINK]"]})  # id `rows`: one past the last row
    tok.save_pretrained(target)
    with pytest.raises(LabError, match=f"the tokenizer's ids run to {rows}, past the model's {rows}-row embedding"):
        load_target(target)


def _target(pad=None, rows=10, eos=None, text_eos=None, gen_eos=None):
    text = SimpleNamespace(eos_token_id=text_eos)
    config = SimpleNamespace(eos_token_id=eos, get_text_config=lambda: text)
    model = SimpleNamespace(config=config, generation_config=SimpleNamespace(eos_token_id=gen_eos),
                            get_input_embeddings=lambda: SimpleNamespace(num_embeddings=rows))
    return SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=pad, eos_token_id=2))


@pytest.mark.parametrize("pad, want", [(3, 3), (None, 0), (10, 0), (-1, 0)])
def test_a_pad_id_the_embedding_lacks_pads_with_0(pad, want):
    assert pad_token_id(_target(pad=pad)) == want


def test_stop_ids_take_the_text_models_eos_where_the_wrapper_has_none():
    assert stop_token_ids(_target(eos=None, text_eos=7, gen_eos=[2, 9])) == [2, 7, 9]
    assert stop_token_ids(_target(eos=5, text_eos=7)) == [2, 5]


@pytest.mark.parametrize("value, trusted", [("1", True), ("True", True), ("YES", True), ("", False), ("0", False)])
def test_remote_code_env_spellings(monkeypatch, value, trusted):
    monkeypatch.setenv(REMOTE_CODE_ENV, value)
    assert trusts_remote_code() is trusted


def test_no_refusal_naming_the_flag_once_it_is_given(monkeypatch):
    # The model's own code failing for another reason must not tell the user to pass the flag they passed.
    e = ValueError("requires you to execute code: pass trust_remote_code=True")
    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    assert "--trust-remote-code" in str(remote_code_refusal(e, Path("m"), "model"))
    monkeypatch.setenv(REMOTE_CODE_ENV, "1")
    assert remote_code_refusal(e, Path("m"), "model") is None


@pytest.mark.parametrize("key", ["text_config", "language_config", "llm_config"])
def test_text_model_fields_under_each_name(key):
    assert text_model_fields({key: {"hidden_size": 8}, "vision_config": {}}) == {"hidden_size": 8}
    assert text_model_fields({key: "not fields"}) is None


def test_first_line_of_an_exception_without_a_message_is_its_type():
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError("  \n")) == "ValueError"


def test_lost_shards_are_counted(tmp_path):
    # The first lost shard by name and how many more: a partial download usually lacks several.
    index = {"weight_map": {f"t{i}": f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00002-of-00004.safetensors").write_bytes(b"")
    with pytest.raises(LabError) as e:
        check_shards(tmp_path)
    assert str(e.value) == (f"{tmp_path}: model.safetensors.index.json names shard model-00001-of-00004.safetensors "
                            "and 2 more, which are missing: a partial download?")


def test_the_stored_embedding_is_the_shortest_match_over_an_mtp_copy():
    # DeepSeek's MTP layer keeps its own embed_tokens; a wrapper stores the text model under another prefix.
    stored = ["language_model.model.layers.61.embed_tokens.weight", "language_model.model.embed_tokens.weight"]
    assert _stored_name("model.language_model.embed_tokens.weight", {n: n for n in stored}) == stored[1]
    assert _stored_name("model.embed_tokens.weight", {"lm_head.weight": "lm_head.weight"}) is None



def test_a_head_of_another_width_than_hidden_size_is_refused(random_llama, tmp_path):
    # Training would multiply the drafter's states by it and fail deep in a matmul, or worse, broadcast.
    target = shutil.copytree(random_llama, tmp_path / "wide_head")
    f = target / "model.safetensors"
    tensors = load_file(str(f))
    rows, hidden = tensors["lm_head.weight"].shape
    tensors["lm_head.weight"] = torch.zeros(rows, hidden + 8)
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(LabError, match=rf"lm_head \({rows}, {hidden + 8}\) do not match hidden_size {hidden}"):
        load_target_head(target)


def test_a_tokenizer_without_pad_or_chat_template_gets_eos_and_chatml(random_llama, tmp_path):
    target = shutil.copytree(random_llama, tmp_path / "bare")
    tok = load_tokenizer(target)
    tok.pad_token, tok.chat_template = None, None
    tok.save_pretrained(target)
    for f in target.glob("chat_template.*"):
        f.unlink()
    with pytest.warns(UserWarning, match="no chat template; using the default ChatML template"):
        tok = load_tokenizer(target)
    assert tok.chat_template == DEFAULT_CHAT_TEMPLATE
    assert tok.pad_token == tok.eos_token is not None


def _config_dir(tmp_path, **config):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return d


def test_a_drafters_directory_or_one_without_weights_is_no_target(tmp_path):
    d = _config_dir(tmp_path, architectures=["LlamaForCausalLMEagle3"])
    with pytest.raises(LabError, match=r"a drafter \(LlamaForCausalLMEagle3\), not a target model"):
        load_target_config(d)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(LabError, match="no weight files"):
        load_target_config(d)
    with pytest.raises(LabError, match="is a file, not a model directory"):
        load_target_config(d / "config.json")


def test_a_json_file_that_is_no_object_is_named(tmp_path):
    d = _config_dir(tmp_path)
    (d / "generation_config.json").write_text("[1, 2]")
    e = broken_file(d, MODEL_JSON)
    assert str(e) == f"{d / 'generation_config.json'}: is a JSON list, not the object transformers reads"


def test_a_shard_index_naming_no_file_is_named(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 1}}))
    with pytest.raises(LabError, match="not a shard index"):
        check_shards(tmp_path)


class LlamaForCausalLM(torch.nn.Module):
    config = SimpleNamespace(architectures=None)


def test_an_architecture_config_json_gives_as_no_list_is_not_taken(tmp_path):
    d = _config_dir(tmp_path, architectures="MistralForCausalLM")
    assert Target(d, LlamaForCausalLM(), None, "f").architecture == "LlamaForCausalLM"


def test_quiet_transformers_hides_bars_and_the_load_report_for_its_span_only():
    from transformers.utils import logging as hf_logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    report = logging.getLogger("transformers.modeling_utils")
    report.addHandler(handler)
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        with quiet_transformers(load_report=False):
            assert not hf_logging.is_progress_bar_enabled()
            report.warning("LOAD REPORT from_pretrained")
            report.warning("other news")
        assert hf_logging.is_progress_bar_enabled()
        report.warning("LOAD REPORT after")
    finally:
        report.removeHandler(handler)
        if not was:
            hf_logging.disable_progress_bar()
    assert seen == ["other news", "LOAD REPORT after"]
