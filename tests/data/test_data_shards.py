"""ShardWriter: sequences put in any order, as capture finishes them, give the same shard as in
order, and read back equal; a shard missing a sequence never lands; a manifest this lab cannot read is
one line naming it."""

from __future__ import annotations

import json
import random

import pytest
import torch

from drafter_lab.data.shards import MANIFEST, FeatureSet, ShardReader, ShardWriter
from drafter_lab.errors import LabError


def test_sequences_put_in_any_order_give_the_same_shard(features, tmp_path):
    seqs = FeatureSet(features).sequences("train")
    assert len({len(s.input_ids) for s in seqs}) > 1
    ids, lengths, hidden = [s.seq_id for s in seqs], [len(s.input_ids) for s in seqs], seqs[0].final_hidden.shape[1]
    shuffled = list(range(len(seqs)))
    random.Random(0).shuffle(shuffled)
    rows = []
    for name, order in (("a", shuffled), ("b", range(len(seqs)))):
        with ShardWriter(tmp_path / name, "train", 0, ids, lengths, hidden, torch.bfloat16) as w:
            for j in order:
                w.put(j, seqs[j])
        rows.append(w.row)
    assert rows[0] == rows[1] and rows[0]["tokens"] == sum(lengths)
    assert rows[0]["loss_tokens"] == sum(int(s.loss_mask.sum()) for s in seqs)
    shard = tmp_path / "a" / rows[0]["file"]
    assert shard.read_bytes() == (tmp_path / "b" / rows[0]["file"]).read_bytes()
    reader = ShardReader()
    for seq, ref in zip(seqs, reader.index(shard, hidden), strict=True):
        got = reader.read(ref)
        assert got.seq_id == seq.seq_id and torch.equal(got.input_ids, seq.input_ids)
        assert torch.equal(got.loss_mask, seq.loss_mask)
        assert torch.equal(got.aux_hidden, seq.aux_hidden.bfloat16())
        assert torch.equal(got.final_hidden, seq.final_hidden.bfloat16())

def test_a_shard_lands_only_with_every_sequence_in_its_slot(features, tmp_path):
    seqs = FeatureSet(features).sequences("train")[:3]
    args = (tmp_path, "train", 0, [s.seq_id for s in seqs], [len(s.input_ids) for s in seqs],
            seqs[0].final_hidden.shape[1], torch.float32)
    with pytest.raises(ValueError, match="is not slot 0"), ShardWriter(*args) as w:
        w.put(0, seqs[1])  # another sequence's slot
    with pytest.raises(ValueError, match="is not slot 1"), ShardWriter(*args) as w:
        w.put(1, seqs[1])
        w.put(1, seqs[1])  # twice
    with pytest.raises(ValueError, match="never written"), ShardWriter(*args) as w:
        w.put(0, seqs[0])
        w.put(2, seqs[2])
    assert w.row is None and list(tmp_path.iterdir()) == []  # no shard, no temp file


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: {**m, "created_by": "drafter_lab 9"}, "unknown field 'created_by' (written by a newer drafter_lab?)"),
    (lambda m: [m], "not a JSON object"),
    *[(lambda m, k=k: {f: v for f, v in m.items() if f != k}, f"no {k!r} field")
      for k in ("target", "aux_layer_ids", "dtype")],
    (lambda m: {**m, "shards": []}, "'shards' is not an object"),
    (lambda m: {**m, "target": {**m["target"], "hidden_size": "64"}}, "'target' lacks its fingerprint or hidden_size"),
    (lambda m: {**m, "shards": {**m["shards"], "train": [{**m["shards"]["train"][0], "file": 7}]}},
     "a 'train' shard row lacks a string 'file' or integer sequences, tokens, loss_tokens"),
    (lambda m: {**m, "shards": {"train": "train-00000.safetensors"}}, "shards of 'train' are not a list of objects"),
    (lambda m: {**m, "format": "drafter_lab.features/2"},
     "unknown feature format 'drafter_lab.features/2' (want drafter_lab.features/1)"),
    (lambda m: {**m, "aux_layer_ids": [1, "2", 3]}, "'aux_layer_ids' holds a non-integer"),
    (lambda m: {**m, "shards": {**m["shards"], "val": [{**m["shards"]["train"][0], "tokens": 5.0}]}},
     "a 'val' shard row lacks a string 'file' or integer sequences, tokens, loss_tokens"),
    (lambda m: {**m, "shards": {**m["shards"], "train": [{**m["shards"]["train"][0], "loss_tokens": None}]}},
     "a 'train' shard row lacks a string 'file' or integer sequences, tokens, loss_tokens"),
])
def test_a_manifest_of_another_shape_is_one_line_naming_it(features, tmp_path, edit, message):
    manifest = json.loads((features / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps(edit(manifest)))
    with pytest.raises(LabError) as e:
        FeatureSet(tmp_path)
    assert str(e.value) == f"{tmp_path / MANIFEST}: {message}"
