"""Mutation audit (review s74, h3) of data.vocab's counting: token frequencies from a hand-built feature
set (real shards and manifest), each shard checked against its manifest row and the target vocab."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.data.shards import FeatureSet, Manifest, Sequence, ShardWriter
from drafter_lab.data.vocab import build_vocab, count_train_tokens
from drafter_lab.errors import LabError

V, H = 12, 4


def write_features(directory, splits: dict, vocab_size=V):
    """A feature set whose `splits` map a split to its shards, each a list of (ids, loss mask)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = {}
    for split, shards in splits.items():
        rows[split] = []
        for index, seqs in enumerate(shards):
            names = [f"{split}{index}-{j}" for j in range(len(seqs))]
            with ShardWriter(directory, split, index, names, [len(ids) for ids, _ in seqs], H, torch.float32) as w:
                for j, (ids, mask) in enumerate(seqs):
                    n = len(ids)
                    w.put(j, Sequence(names[j], torch.tensor(ids, dtype=torch.int32),
                                      torch.tensor(mask, dtype=torch.uint8), torch.zeros(n, 3 * H), torch.zeros(n, H)))
            rows[split].append(w.row)
    target = {"fingerprint": "fp", "hidden_size": H}
    if vocab_size is not None:
        target["vocab_size"] = vocab_size
    Manifest(target=target, aux_layer_ids=[1, 2, 3], dtype="float32", shards=rows).save(directory)
    return directory


def test_counts_take_every_loss_masked_position_of_every_train_shard_and_nothing_else(tmp_path):
    """The first token of a shard counts when it is masked in (a row read from 0, not 1); val and
    prompt positions never count."""
    feat = write_features(tmp_path / "f", {
        "train": [[([5, 1, 5], [1, 0, 1]), ([7, 5], [1, 1])], [([9, 7, 3], [1, 1, 0])]],
        "val": [[([2, 2, 2], [1, 1, 1])]],
    })
    want = torch.zeros(V, dtype=torch.int64)
    want[5], want[7], want[9] = 3, 2, 1
    assert torch.equal(count_train_tokens(feat), want)
    assert torch.equal(count_train_tokens(FeatureSet(feat)), want)  # opened already: the same counts
    assert build_vocab(feat, 2).used.tolist() == [5, 7]


def test_a_shard_holding_other_tokens_than_its_manifest_row_lists_is_refused(tmp_path):
    """A row listing fewer tokens than its shard holds: counting its first rows alone would be a silent
    part of the split; the shard is refused as training's index refuses it."""
    feat = write_features(tmp_path / "f", {"train": [[([5, 1, 5], [1, 1, 1]), ([7, 5], [1, 1])]]})
    manifest = json.loads((feat / "manifest.json").read_text())
    manifest["shards"]["train"][0]["tokens"] = 3
    (feat / "manifest.json").write_text(json.dumps(manifest))
    shard = feat / "train-00000.safetensors"
    with pytest.raises(LabError, match=rf"^{shard}: holds 2 sequences of 5 tokens; the manifest lists 2 of 3$"):
        count_train_tokens(feat)


@pytest.mark.parametrize("bad", [V, -1])
def test_a_loss_masked_token_id_outside_the_target_vocab_names_its_shard(tmp_path, bad):
    """Not a bincount error (a negative id) or a shape mismatch (an id past V) from torch."""
    feat = write_features(tmp_path / "f", {"train": [[([5, 1], [1, 1])], [([3, bad, 4], [1, 1, 0])]]})
    shard = feat / "train-00001.safetensors"
    with pytest.raises(LabError, match=rf"^{shard}: token id {bad} outside the target vocab \({V}\)$"):
        count_train_tokens(feat)


def test_an_out_of_vocab_id_at_a_prompt_position_is_not_counted_nor_refused(tmp_path):
    feat = write_features(tmp_path / "f", {"train": [[([V + 3, 4], [0, 1])]]})
    assert count_train_tokens(feat).tolist() == [0, 0, 0, 0, 1] + [0] * (V - 5)


@pytest.mark.parametrize("vocab_size", [None, "12", 12.0, True, 0, -3])
def test_a_manifest_without_an_integer_target_vocab_size_is_refused_in_one_line(tmp_path, vocab_size):
    """The manifest's shape check lets a target without vocab_size through (reads skip the id check
    then); counting needs it: a one-line refusal naming manifest.json, not a KeyError or a torch error."""
    feat = write_features(tmp_path / "f", {"train": [[([5, 1], [1, 1])]]}, vocab_size=vocab_size)
    manifest = feat / "manifest.json"
    with pytest.raises(LabError, match=rf"^{manifest}: 'target' records no vocab_size \(an integer >= 1\), got "):
        count_train_tokens(feat)


def test_a_one_token_target_vocab_is_counted(tmp_path):
    """vocab_size 1 is the smallest the refusal above lets through."""
    feat = write_features(tmp_path / "f", {"train": [[([0, 0, 0], [1, 0, 1])]]}, vocab_size=1)
    assert count_train_tokens(feat).tolist() == [2]


def test_vocab_build_on_a_manifest_without_a_target_vocab_size_exits_2_in_one_line(tmp_path, capsys):
    """`vocab build` checks --size against the recorded size before counting: the same refusal there,
    not a KeyError traceback."""
    from drafter_lab.cli import main

    feat = write_features(tmp_path / "f", {"train": [[([5, 1], [1, 1])]]}, vocab_size=None)
    assert main(["vocab", "build", "--data", str(feat), "--size", "2", "--out", str(tmp_path / "v.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {feat / 'manifest.json'}: 'target' records no vocab_size") and "\n" not in err
    assert not (tmp_path / "v.safetensors").exists()
