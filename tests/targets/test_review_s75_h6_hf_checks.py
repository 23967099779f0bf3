"""Review (s75, h6) of targets.hf's quick checks: the head-only load refuses a lost shard as the whole load
does, a hand-written aux layer id is a one-line error naming its source, and tokenizer files kept only in a
`tokenizer/` subdirectory (which transformers does not read) fail the quick check."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import (
    check_aux_layer_ids,
    check_tokenizer_dir,
    load_target,
    load_target_head,
    load_tokenizer,
)


def _split_in_two(src, dst):
    """`src` (one model.safetensors) copied to `dst` as two shards and their index: the embedding and
    lm_head in the first, the layers in the second."""
    path = shutil.copytree(src, dst)
    tensors = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    vocab = {k: v for k, v in tensors.items() if "embed_tokens" in k or k.startswith("lm_head")}
    layers = {k: v for k, v in tensors.items() if k not in vocab}
    names = {"model-1.safetensors": vocab, "model-2.safetensors": layers}
    for name, part in names.items():
        save_file(part, str(path / name))
    weight_map = {k: name for name, part in names.items() for k in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_the_head_only_load_refuses_a_lost_shard_as_the_whole_load_does(random_llama, tmp_path):
    """The layers' shard lost, the embedding's and head's there: the head alone read fine and its
    fingerprint hashed the files left, so training went on for a target that cannot load."""
    path = _split_in_two(random_llama, tmp_path / "m")
    assert load_target_head(path).lm_head.shape[0] > 0  # whole, the split loads
    (path / "model-2.safetensors").unlink()
    said = f"{path}: model.safetensors.index.json names shard model-2.safetensors, which is missing: a partial download?"
    for load in (load_target, load_target_head):
        with pytest.raises(LabError) as e:
            load(path)
        assert str(e.value) == said


@pytest.mark.parametrize("ids", [["two", 4, 5], [2, None, 5], [2, 4.5, 5], [True, 4, 5], [2, float("nan"), 5],
                                 [2, float("inf"), 5], 5, "245"])
def test_an_aux_layer_id_that_is_no_whole_number_names_its_source(ids, tmp_path):
    # int() raised a bare ValueError or TypeError, cut 4.5 to 4, took true for 1, and "245" for [2, 4, 5]
    with pytest.raises(LabError) as e:
        check_aux_layer_ids(ids, 8, tmp_path / "config.json")
    assert str(e.value) == (f"{tmp_path / 'config.json'}: aux layer ids must be whole numbers (hidden_states "
                            f"indices), got {ids!r}")


def test_whole_aux_layer_ids_of_other_types_still_read():
    assert check_aux_layer_ids(("2", 4.0, 5), 8, None) == [2, 4, 5]


def test_tokenizer_files_only_in_a_subdirectory_fail_the_quick_check(random_llama, tmp_path):
    """AutoTokenizer.from_pretrained(dir) reads no file of dir/tokenizer/: the glob "tokenizer*" matched the
    directory itself, so the check passed and the load failed after the model's minutes of loading."""
    path = shutil.copytree(random_llama, tmp_path / "m")
    (path / "tokenizer").mkdir()
    for f in [*path.glob("tokenizer*"), *path.glob("vocab*"), *path.glob("merges*")]:
        if f.is_file():
            f.rename(path / "tokenizer" / f.name)
    with pytest.raises(LabError) as e:
        check_tokenizer_dir(path)
    assert str(e.value) == (f"{path}: no tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, "
                            "vocab.json, ...) beside config.json, where transformers reads them (it does not look in "
                            "the tokenizer/ subdirectory): copy them up")
    (path / "tokenizer" / "tokenizer.json").rename(path / "tokenizer.json")
    check_tokenizer_dir(path)  # one file beside config.json: a tokenizer for the load to try


def test_a_vocab_directory_is_no_vocabulary_file(random_llama, tmp_path):
    """A tokenizer_config.json alone beside a `vocab/` directory: the partial download is named as such,
    not sent on to transformers' paragraph on converting slow tokenizers."""
    path = shutil.copytree(random_llama, tmp_path / "m")
    (path / "tokenizer.json").unlink()
    (path / "vocab").mkdir()
    with pytest.raises(LabError, match=r"^.*: cannot load tokenizer: no tokenizer.json \(nor tokenizer.model"):
        load_tokenizer(path)
