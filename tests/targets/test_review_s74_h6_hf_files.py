"""targets.hf's file checks that no test reached: broken_file naming a JSON file that does not parse and
leaving the weights alone for a tokenizer's failure; a dangling or corrupt .bin named with what was wrong;
one or two lost shards counted; a config transformers cannot read refused unless it asks for remote code,
and one that does read as written, rope_parameters kept; safetensors of another name read for the head;
paths given as strings."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import (
    REMOTE_CODE_ENV,
    TOKENIZER_JSON,
    broken_file,
    check_shards,
    load_target,
    load_target_config,
    load_target_head,
)


def test_a_json_file_that_does_not_parse_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{cut short")
    e = broken_file(tmp_path, TOKENIZER_JSON)
    assert str(e).startswith(f"{tmp_path / 'tokenizer_config.json'}: not valid JSON")


def test_a_tokenizers_failure_does_not_blame_the_weights(tmp_path):
    # Only a model's load reads the weight files: a corrupt one is no reason the tokenizer failed.
    (tmp_path / "model.safetensors").write_bytes(b"cut short")
    assert broken_file(tmp_path, TOKENIZER_JSON) is None
    assert broken_file(tmp_path, TOKENIZER_JSON, weights=True) is not None


def test_a_dangling_bin_link_is_named_with_the_os_reason(tmp_path):
    f = tmp_path / "pytorch_model.bin"
    f.symlink_to(tmp_path / "gone.bin")
    assert str(broken_file(tmp_path, (), weights=True)) == (
        f"{f}: cannot read torch weights file: No such file or directory")


@pytest.mark.parametrize("content, said", [
    (b"\x80\x02" + b"not a pickle" * 20, "UnpicklingError: Weights only load failed"),
    (b"", "EOFError"),  # an error with no message is named once, not "EOFError: EOFError"
])
def test_a_bin_that_is_no_pickle_says_which_error_torch_gave(tmp_path, content, said):
    f = tmp_path / "pytorch_model.bin"
    f.write_bytes(content)
    assert str(broken_file(tmp_path, (), weights=True)) == f"{f}: cannot read torch weights file (corrupt?): {said}"


def _config_dir(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


def test_a_model_type_transformers_does_not_know_is_refused(tmp_path):
    # Read as written only where transformers asks for the model's own code; else a typo'd model_type
    # would pass as a plain config.
    d = _config_dir(tmp_path, {"model_type": "no_such_model_xyz", "hidden_size": 8})
    with pytest.raises(LabError, match=rf"^{tmp_path}: cannot read the model config: .*`no_such_model_xyz`"):
        load_target_config(d)


def test_a_path_given_as_a_string_is_read(random_llama):
    whole, text = load_target_config(str(random_llama))
    assert whole.model_type == text.model_type == "llama"


def test_a_config_json_that_is_no_object_is_named(tmp_path):
    # Was "cannot read the model config: Unrecognized model in DIR. Should have a `model_type` key" from the
    # head-only load (load_target named the file).
    d = _config_dir(tmp_path, [1])
    for load in (load_target_config, load_target_head, load_target):
        with pytest.raises(LabError) as e:
            load(d)
        assert str(e.value) == f"{d / 'config.json'}: is a JSON list, not the object transformers reads"


@pytest.mark.parametrize("lost, said", [(1, "model-1.safetensors, which is"),
                                        (2, "model-1.safetensors and 1 more, which are")])
def test_one_or_two_lost_shards_are_counted(tmp_path, lost, said):
    shards = [f"model-{i}.safetensors" for i in range(1, 4)]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(zip("abc", shards))}))
    for f in shards[lost:]:
        (tmp_path / f).write_bytes(b"")
    with pytest.raises(LabError) as e:
        check_shards(tmp_path)
    assert str(e.value) == f"{tmp_path}: model.safetensors.index.json names shard {said} missing: a partial download?"


def test_safetensors_under_another_name_without_an_index_are_read(random_llama, tmp_path):
    path = shutil.copytree(random_llama, tmp_path / "m")
    stored = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").rename(path / "weights.safetensors")
    head = load_target_head(path)
    assert torch.equal(head.embed, stored["model.embed_tokens.weight"])
    assert torch.equal(head.lm_head, stored["lm_head.weight"])


def test_a_config_of_its_own_code_keeps_the_rope_parameters_it_writes(tmp_path, monkeypatch):
    # Read as written (no rope_scaling to move into them): transformers 5's own spelling stays.
    monkeypatch.setenv(REMOTE_CODE_ENV, "")
    rope = {"rope_type": "default", "rope_theta": 5.0}
    d = _config_dir(tmp_path, {"model_type": "my_own_llm", "auto_map": {"AutoConfig": "configuration_x.XConfig"},
                               "hidden_size": 32, "rope_parameters": rope})
    whole, text = load_target_config(d)
    assert whole.rope_parameters == text.rope_parameters == rope
