"""Session 71 audit of drafter/checkpoint.py: shards without an index that lost one, a run.json that
cannot be read, and a run record's target architecture that is no name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import (
    export,
    read_checkpoint,
    read_vocab,
    recorded_fingerprint,
    run_record,
    save_drafter,
)
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError

LATE = (formats.HEAD, "d2t", "t2d")
"""What the second shard holds: all a whole-vocabulary drafter may leave out, so that losing it is silent."""


def _whole_vocab(tmp_path) -> tuple[Path, dict]:
    """A whole-vocabulary drafter (draft vocab = target vocab, d2t a permutation), saved whole: (dir, state)."""
    cfg = DrafterConfig(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, draft_vocab_size=101, target_vocab_size=101, target_hidden_size=40,
                        aux_layer_ids=[2, 4, 5])
    torch.manual_seed(3)
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        for p in drafter.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + 1.0)
        drafter.d2t.copy_(torch.arange(101).roll(5) - torch.arange(101))
        drafter.t2d.fill_(True)
    path = save_drafter(drafter, tmp_path / "d")
    return path, load_file(str(path / "model.safetensors"))


def _split(path: Path, state: dict, names: list[str], parts: list[list[str]]) -> None:
    """model.safetensors replaced by shards of those names holding those tensors, with no index beside them."""
    (path / "model.safetensors").unlink()
    for name, keys in zip(names, parts):
        if name.endswith(".bin"):
            torch.save({k: state[k] for k in keys}, path / name)
        else:
            save_file({k: state[k] for k in keys}, str(path / name))


@pytest.mark.parametrize("first, second", [("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
                                           ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin")])
def test_shards_without_an_index_read_whole_and_a_lost_one_is_refused(tmp_path, first, second):
    """The second shard gone read as a drafter that shares its target's head and maps draft ids as the
    identity: served with the wrong head and mapping, without a word."""
    path, state = _whole_vocab(tmp_path)
    _split(path, state, [first, second], [[k for k in state if k not in LATE], list(LATE)])
    ckpt = read_checkpoint(path)
    assert ckpt.has_head and ckpt.filled == () and torch.equal(ckpt.tensors["d2t"], state["d2t"])
    (path / second).unlink()
    for reader in (read_checkpoint, read_vocab):
        with pytest.raises(LabError) as e:
            reader(path)
        assert str(e.value) == (f"{path}: shard {second} is missing (the shards' names count 2): a save cut short "
                                "or a partial download")


def test_the_first_of_several_lost_shards_is_named_and_the_rest_counted(tmp_path):
    path, state = _whole_vocab(tmp_path)
    _split(path, state, ["model-00003-of-00003.safetensors"], [list(state)])
    with pytest.raises(LabError) as e:
        read_checkpoint(path)
    assert str(e.value) == (f"{path}: shard model-00001-of-00003.safetensors and 1 more are missing (the shards' "
                            "names count 3): a save cut short or a partial download")


def test_shard_numbers_are_read_as_numbers(tmp_path):
    """Unpadded numbers (shard 9 and 10 of 10 in the names' own widths) name shards of one save; one lost is
    named as the others are written."""
    path, state = _whole_vocab(tmp_path)
    keys = sorted(state)
    names = [f"m-{i}-of-10.safetensors" for i in range(1, 11)]
    _split(path, state, names, [keys[i::10] for i in range(10)])
    assert set(read_checkpoint(path).tensors) >= set(state)
    (path / "m-9-of-10.safetensors").unlink()
    with pytest.raises(LabError, match=r": shard m-9-of-10\.safetensors is missing \(the shards' names count 10\)"):
        read_checkpoint(path)


def test_a_stale_file_beside_a_lone_shard_is_still_in_two_places(tmp_path):
    """Both checks fail here: the one that says which file to remove speaks first."""
    path, state = _whole_vocab(tmp_path)
    _split(path, state, ["model-00001-of-00002.safetensors", "model.safetensors"], [list(state), ["fc.weight"]])
    with pytest.raises(LabError, match="tensor 'fc.weight' is in two places"):
        read_checkpoint(path)


def test_a_run_json_that_is_a_directory_is_one_line(tmp_path, capsys):
    """It was skipped as no record at all: the fingerprint check against the target went unsaid."""
    path, _ = _whole_vocab(tmp_path)
    (path / "run.json").mkdir()
    with pytest.raises(LabError) as e:
        recorded_fingerprint(path)
    assert str(e.value) == f"{path / 'run.json'}: is a directory, not a JSON file"
    assert main(["export", "--drafter", str(path), "--format", "speculators", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"error: {path / 'run.json'}: is a directory, not a JSON file\n"


def test_a_run_json_that_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    """Another user's 0600 file (root reads any, so the refusal is stood in for): a PermissionError traceback."""
    path, _ = _whole_vocab(tmp_path)
    (path / "run.json").write_text("{}")
    read_text = Path.read_text

    def refused(self, *args, **kwargs):
        if self.name == "run.json":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refused)
    with pytest.raises(LabError) as e:
        run_record(path)
    assert str(e.value) == f"{path / 'run.json'}: cannot read it: Permission denied"


def test_no_run_json_or_a_file_given_is_no_record(tmp_path):
    path, _ = _whole_vocab(tmp_path)
    assert run_record(path) == {} and run_record(path / "model.safetensors") == {}


def test_a_recorded_architecture_that_is_no_string_is_refused_where_it_is_carried(tmp_path):
    """A list (config.json's `architectures` copied) went into vLLM's verifier architectures as a nested list."""
    path, _ = _whole_vocab(tmp_path)
    (path / "run.json").write_text(json.dumps({"config": {}, "target": {"architecture": ["LlamaForCausalLM"]}}))
    with pytest.raises(LabError) as e:
        export(path, formats.SPECULATORS, tmp_path / "out", verifier="org/target")
    assert str(e.value) == f"{path / 'run.json'}: run record's target.architecture is ['LlamaForCausalLM'], not a string"
    assert not (tmp_path / "out").exists()
    # without --verifier it is not carried, so not refused
    export(path, formats.SPECULATORS, tmp_path / "plain")
    verifier = json.loads((tmp_path / "plain/config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": None, "architectures": []}


def test_a_recorded_architecture_is_carried_with_the_verifier(tmp_path):
    path, _ = _whole_vocab(tmp_path)
    (path / "run.json").write_text(json.dumps({"config": {}, "target": {"architecture": "LlamaForCausalLM"}}))
    export(path, formats.SPECULATORS, tmp_path / "out", verifier="org/target")
    verifier = json.loads((tmp_path / "out/config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]}


def test_an_sglang_export_does_not_read_the_run_record(tmp_path):
    """SGLang's layout carries nothing of it, so a broken one does not stop that export."""
    path, state = _whole_vocab(tmp_path)
    (path / "run.json").write_text("[]")
    export(path, formats.SGLANG, tmp_path / "out")
    assert torch.equal(load_file(str(tmp_path / "out/model.safetensors"))["fc.weight"], state["fc.weight"])
