"""hf.py's small checks, pinned where a mutation audit (session 74, h5) found them untested: aux ids
given as a tuple, the out-of-range message, which directories check_tokenizer_dir takes, and what
load_tokenizer keeps of a tokenizer's own; load_target's checks, through it; check_loading_info's
counts; a LogitMap scale of 2."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import (
    LogitMap,
    check_aux_layer_ids,
    check_loading_info,
    check_tokenizer_dir,
    load_target,
    load_tokenizer,
)


def test_aux_ids_given_as_a_tuple_are_a_list_in_layer_order():
    """Taken as a list: a tuple is unequal to its sorted list, and would be refused as out of order."""
    ids = check_aux_layer_ids((2, 4, 5), 8, None)
    assert ids == [2, 4, 5] and type(ids) is list


def test_an_out_of_range_id_names_the_last_layer_and_the_final_norm():
    with pytest.raises(LabError) as e:
        check_aux_layer_ids([2, 4, 12], 12, None)
    assert str(e.value) == ("aux layer id(s) [12] out of range: hidden_states indices run 0..11 "
                            "(12 is the final norm's output, which serving engines do not capture)")


@pytest.mark.parametrize("name", ["vocab.txt", "merges.txt", "spiece.model", "tokenizer_config.json"])
def test_a_directory_with_any_tokenizer_file_passes(tmp_path, name):
    """A WordPiece vocab.txt alone (BERT's) is a vocabulary as much as a tokenizer.json is."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / name).write_text("x")
    check_tokenizer_dir(tmp_path)


def test_a_directory_with_no_tokenizer_file_says_what_it_is_not(tmp_path):
    with pytest.raises(LabError) as e:
        check_tokenizer_dir(tmp_path)
    assert str(e.value) == (f"{tmp_path}: not a model or tokenizer directory: no config.json and no tokenizer files "
                            "(tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json, ...)")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(LabError, match=r"\.\.\.\): give the model's own directory, which holds its tokenizer$"):
        check_tokenizer_dir(tmp_path)


def test_a_missing_path_or_a_file_is_no_tokenizer_directory(tmp_path):
    with pytest.raises(LabError, match="model directory not found$"):
        check_tokenizer_dir(tmp_path / "gone")
    (tmp_path / "tokenizer.json").write_text("{}")  # a tokenizer file given for its directory
    with pytest.raises(LabError, match="is a file, not a model directory"):
        check_tokenizer_dir(tmp_path / "tokenizer.json")


def test_a_tokenizers_own_pad_and_chat_template_are_kept_without_a_warning(random_llama, tmp_path):
    target = shutil.copytree(random_llama, tmp_path / "own")
    tok = load_tokenizer(target)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = load_tokenizer(target)
    assert tok.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")


def test_the_missing_chat_template_warning_names_the_caller(random_llama, tmp_path):
    """stacklevel 2: the warning points at the code that loaded the tokenizer, not into hf.py or above it."""
    target = shutil.copytree(random_llama, tmp_path / "bare")
    tok = load_tokenizer(target)
    tok.chat_template = None
    tok.save_pretrained(target)
    for f in target.glob("chat_template.*"):
        f.unlink()
    with pytest.warns(UserWarning, match="no chat template") as caught:
        load_tokenizer(target)
    assert [w.filename for w in caught] == [__file__]


def test_load_target_refuses_a_drafters_directory_by_name(random_llama, tmp_path):
    target = shutil.copytree(random_llama, tmp_path / "drafter")
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(LabError) as e:
        load_target(target, tokenizer=False)
    assert str(e.value) == (f"{target}: a drafter (LlamaForCausalLMEagle3), not a target model: "
                            "give the target's own directory")


def test_a_missing_tokenizer_is_named_before_the_weights_are_read(random_llama, tmp_path):
    """The check runs first, as a large target's weights take minutes: a corrupt weight file behind it
    is not reached."""
    target = shutil.copytree(random_llama, tmp_path / "no_tok", ignore=shutil.ignore_patterns("tokenizer*"))
    (target / "model.safetensors").write_bytes(b"cut short")
    with pytest.raises(LabError, match="no tokenizer files .*: give the model's own directory"):
        load_target(target)
    with pytest.raises(LabError, match="cannot read safetensors file"):
        load_target(target, tokenizer=False)


def test_a_weight_file_lacking_a_tensor_is_refused_not_filled_at_random(random_llama, tmp_path):
    target = shutil.copytree(random_llama, tmp_path / "lacking")
    tensors = load_file(str(target / "model.safetensors"))
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LabError) as e:
        load_target(target, tokenizer=False)
    assert str(e.value) == (f"{target}: the weight files lack model.layers.3.mlp.up_proj.weight, which transformers "
                            "would fill with random values (a partial download, or tensors under other names?)")


def test_a_base_vocabulary_one_id_past_the_embedding_is_refused(random_llama, tmp_path):
    """No added token past it: the base vocabulary's last id alone is one row too many."""
    from transformers import AutoModelForCausalLM

    target = shutil.copytree(random_llama, tmp_path / "shrunk", ignore=shutil.ignore_patterns("model.safetensors"))
    tok = load_tokenizer(random_llama)
    assert max(tok.added_tokens_decoder) < tok.vocab_size - 1
    model = AutoModelForCausalLM.from_pretrained(random_llama)
    model.resize_token_embeddings(tok.vocab_size - 1)
    model.save_pretrained(target)
    rows = tok.vocab_size - 1
    with pytest.raises(LabError, match=rf"ids run to {rows}, past the model's {rows}-row embedding"):
        load_target(target)
    assert load_target(target, tokenizer=False).vocab_size == rows


def test_one_mismatched_tensor_is_named_without_a_count(tmp_path):
    info = {"missing_keys": set(), "mismatched_keys": {("a.weight", torch.Size([4, 2]), torch.Size([5, 2]))}}
    with pytest.raises(LabError) as e:
        check_loading_info(info, tmp_path)
    assert str(e.value) == f"{tmp_path}: tensor a.weight has shape (4, 2) in the weight files, config.json gives (5, 2)"


def test_the_first_of_several_is_named_by_name_and_the_rest_counted(tmp_path):
    with pytest.raises(LabError, match=r"lack a\.weight and 1 more, which"):
        check_loading_info({"missing_keys": {"b.weight", "a.weight"}}, tmp_path)
    mismatched = {("b.weight", torch.Size([1, 2]), torch.Size([1, 3])), ("a.weight", torch.Size([5]), torch.Size([6]))}
    with pytest.raises(LabError) as e:
        check_loading_info({"mismatched_keys": mismatched}, tmp_path)
    assert str(e.value) == f"{tmp_path}: tensor a.weight has shape (5,) in the weight files, config.json gives (6,) (and 1 more)"


def test_a_scale_of_2_doubles_the_logits():
    raw = torch.tensor([[1.0, -3.0, 0.5]])
    assert torch.equal(LogitMap(2.0)(raw), 2 * raw) and torch.equal(LogitMap()(raw), raw)
