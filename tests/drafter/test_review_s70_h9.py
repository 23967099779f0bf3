"""Review s70 (h9): a shard index that lists no shards beside shards of the kind read is refused, naming the index
(skipped, a lost shard went unnoticed: a whole-vocabulary drafter's lost lm_head read as shared with its target);
the checkpoint tail (served_with_vocab, build, save, export, the run record) pinned where mutants survived."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import (
    export,
    load_drafter,
    read_checkpoint,
    read_vocab,
    recorded_fingerprint,
    save_drafter,
)
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config
from .test_review_s59_ckpt_shards import _sharded

INDEX = "model.safetensors.index.json"
HEAD_SHARD = "model-00002-of-00002.safetensors"  # _sharded puts the lm_head alone in it


def _broken_indexes(path):
    """What transformers refuses as a shard index: no weight_map, not an object, a shard that is no file name."""
    weight_map = json.loads((path / INDEX).read_text())["weight_map"]
    return {"no weight_map": {"metadata": {"total_size": 0}}, "a list": list(weight_map),
            "weight_map a list": {"weight_map": list(weight_map)},
            "a null shard": {"weight_map": {k: None if v == HEAD_SHARD else v for k, v in weight_map.items()}}}


@pytest.mark.parametrize("case", ["no weight_map", "a list", "weight_map a list", "a null shard"])
def test_a_shard_index_listing_no_shards_beside_a_lost_shard_is_one_line_naming_it(tmp_path, case):
    path = _sharded(tmp_path)
    (path / INDEX).write_text(json.dumps(_broken_indexes(path)[case]))
    (path / HEAD_SHARD).unlink()
    for read in (read_checkpoint, read_vocab):
        with pytest.raises(LabError) as e:
            read(path)
        assert str(e.value) == f"{path / INDEX}: not a shard index (an object whose weight_map names a file per tensor)"


def test_a_bin_shard_index_without_a_weight_map_is_refused_too(tmp_path):
    path = _sharded(tmp_path)
    for i in (1, 2):
        shard = path / f"model-0000{i}-of-00002.safetensors"
        torch.save(load_file(str(shard)), path / f"pytorch_model-0000{i}-of-00002.bin")
        shard.unlink()
    (path / INDEX).unlink()
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}}))
    (path / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path / 'pytorch_model.bin.index.json'}: not a shard index (an object whose weight_map "
                            "names a file per tensor)")


def test_a_broken_index_of_the_kind_not_read_is_passed_over(tmp_path):
    """A stale pytorch_model.bin.index.json beside safetensors shards names files no loader reads."""
    path = _sharded(tmp_path)
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}}))
    ckpt = read_checkpoint(path)
    assert ckpt.has_head and sorted(f.name for f in ckpt.files) == ["model-00001-of-00002.safetensors", HEAD_SHARD]


def test_a_run_record_nested_too_deep_to_parse_is_one_line(saved):
    """A RecursionError out of json went past the "not valid JSON" line (export, eval's pairing check)."""
    path, _ = saved
    (path / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(LabError) as e:
        recorded_fingerprint(path)
    assert str(e.value) == f"{path / 'run.json'}: not valid JSON"


def test_an_embedding_given_of_another_size_is_one_line_naming_the_tensor(saved):
    """A target's embedding of another vocab (no vocab_size given) is refused by name, not by torch's size mismatch."""
    path, _ = saved
    with pytest.raises(LabError) as e:
        load_drafter(path, embed_weight=torch.zeros(120, 48))
    assert str(e.value) == (f"{path / 'model.safetensors'}: tensor 'embed_tokens.weight' has shape (120, 48), the "
                            "drafter needs (101, 48)")


def test_the_drafter_is_built_on_the_device_asked_for(saved):
    """The meta device stands in for a GPU: every tensor moves, the d2t/t2d buffers too."""
    path, _ = saved
    drafter = load_drafter(path, device="meta", dtype=torch.bfloat16)
    assert {t.device.type for t in drafter.state_dict().values()} == {"meta"}
    assert {p.dtype for p in drafter.parameters()} == {torch.bfloat16}
    assert (drafter.d2t.dtype, drafter.t2d.dtype) == (torch.int64, torch.bool)


def test_a_drafter_saved_to_a_directory_given_as_text_reads_back(tmp_path):
    drafter = random_drafter(small_config(), seed=5, dtype=torch.float32)
    path = save_drafter(drafter, str(tmp_path / "d"))
    assert path == tmp_path / "d"
    assert torch.equal(read_checkpoint(path).tensors["fc.weight"], drafter.fc.weight)


def test_an_unknown_format_is_refused_before_the_drafter_is_read(tmp_path):
    with pytest.raises(LabError) as e:
        export(tmp_path / "nothing", "onnx", tmp_path / "out")
    assert str(e.value) == "unknown drafter format 'onnx'; known: sglang, speculators"


def test_a_draft_length_of_one_is_exported(saved, tmp_path):
    path, _ = saved
    out = export(path, formats.SPECULATORS, tmp_path / "out", speculative_tokens=1)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 1


def test_a_run_trained_one_step_deep_is_exported_with_a_draft_length_of_one(saved, tmp_path):
    path, _ = saved
    (path / "run.json").write_text(json.dumps({"config": {"ttt_steps": 1}}))
    out = export(path, formats.SPECULATORS, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 1
