"""Shards, second mutation pass: the manifest's counts, the fields it is refused for, a shard that is gone,
and the reader's cap on open shards."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from drafter_lab.data.shards import MANIFEST, FeatureSet, Manifest, ShardReader, ShardWriter
from drafter_lab.errors import LabError


def test_manifest_counts_sum_each_column_of_its_rows():
    rows = [{"file": "train-00000.safetensors", "sequences": 2, "tokens": 30, "loss_tokens": 11},
            {"file": "train-00001.safetensors", "sequences": 3, "tokens": 40, "loss_tokens": 7}]
    m = Manifest(target={"fingerprint": "f", "hidden_size": 4}, aux_layer_ids=[1, 2, 3], dtype="float32",
                 shards={"train": rows, "val": []})
    assert m.counts("train") == {"sequences": 5, "tokens": 70, "loss_tokens": 18}
    assert m.to_json()["counts"] == {"train": {"sequences": 5, "tokens": 70, "loss_tokens": 18},
                                     "val": {"sequences": 0, "tokens": 0, "loss_tokens": 0}}


def test_written_manifest_counts_match_its_shards(features):
    """The counts `data prepare` reports are those of the shards it lists."""
    data = json.loads((features / MANIFEST).read_text())
    for split in ("train", "val"):
        rows = data["shards"][split]
        assert data["counts"][split] == {k: sum(r[k] for r in rows) for k in ("sequences", "tokens", "loss_tokens")}
    seqs = FeatureSet(features).sequences("train")
    assert data["counts"]["train"]["loss_tokens"] == sum(int(s.loss_mask.sum()) for s in seqs)
    assert data["counts"]["train"]["loss_tokens"] < data["counts"]["train"]["tokens"]


def test_a_shard_the_manifest_lists_but_is_gone_is_named_missing(features, tmp_path):
    copy = tmp_path / "feat"
    shutil.copytree(features, copy)
    gone = copy / json.loads((copy / MANIFEST).read_text())["shards"]["train"][0]["file"]
    gone.unlink()
    with pytest.raises(LabError) as e:
        FeatureSet(copy).index("train")
    assert str(e.value) == f"{gone}: feature shard is missing"


def test_the_reader_keeps_at_most_max_open_shards_open_dropping_the_least_recent(tmp_path):
    paths = []
    for k in range(4):
        with ShardWriter(tmp_path, "train", k, [f"s{k}"], [2], 2, torch.float32) as w:
            w.put(0, _seq(f"s{k}"))
        paths.append(tmp_path / w.row["file"])
    reader = ShardReader(max_open=2)
    for p in (paths[0], paths[1], paths[0], paths[2]):  # paths[0] used again: paths[1] is the least recent
        reader.handle(p)
    assert list(reader._open) == [paths[0], paths[2]]
    reader.handle(paths[3])
    assert list(reader._open) == [paths[2], paths[3]]


def _seq(seq_id):
    from drafter_lab.data.shards import Sequence

    return Sequence(seq_id, torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.uint8),
                    torch.zeros(2, 6), torch.zeros(2, 2))


def _raw_shard(path, offsets, seq_ids='["a", "b"]', H=2):
    from safetensors.torch import save_file

    T = offsets[-1]
    save_file({"input_ids": torch.ones(T, dtype=torch.int32), "loss_mask": torch.ones(T, dtype=torch.uint8),
               "aux_hidden": torch.zeros(T, 3 * H), "final_hidden": torch.zeros(T, H),
               "offsets": torch.tensor(offsets, dtype=torch.int64)}, str(path), metadata={"seq_ids": seq_ids})
    return path


@pytest.mark.parametrize("row", [0, 6])
def test_scan_finds_a_nan_in_the_first_or_last_row_whatever_the_chunking(tmp_path, row):
    from safetensors.torch import load_file, save_file

    path = _raw_shard(tmp_path / "train-00000.safetensors", [0, 3, 7])
    t = load_file(str(path))
    t["final_hidden"][row, 1] = float("nan")
    save_file(t, str(path), metadata={"seq_ids": '["a", "b"]'})
    for chunk_bytes in (1, 24, 1 << 28):  # one row, three rows (7 = 3 + 3 + 1), all at once
        with pytest.raises(LabError, match="NaN or inf in final_hidden"):
            ShardReader().scan(path, chunk_bytes=chunk_bytes)


def _edited_copy(features, tmp_path, edit):
    copy = tmp_path / "feat"
    shutil.copytree(features, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    edit(manifest)
    (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy, manifest


@pytest.mark.parametrize(("split", "what"), [
    ("train", "nothing to train on"),
    ("val", "nothing to validate on: capture some (`data prepare --val-fraction`), or pass --val-data"),
])
def test_a_split_whose_manifest_counts_no_loss_token_is_refused(features, tmp_path, split, what):
    def edit(m):
        for r in m["shards"][split]:
            r["loss_tokens"] = 0
    copy, manifest = _edited_copy(features, tmp_path, edit)
    assert manifest["shards"][split]  # the fixture captures both splits
    with pytest.raises(LabError) as e:
        FeatureSet(copy).require(split)
    assert str(e.value) == f"{copy}: no {split} sequences with loss tokens, {what}"


def test_feature_set_reads_check_token_ids_against_the_manifests_vocab(features, tmp_path):
    """FeatureSet.read (the probe's path) refuses an id past the capturing target's vocab, naming the shard."""
    copy, manifest = _edited_copy(features, tmp_path, lambda m: m["target"].update(vocab_size=3))
    fs = FeatureSet(copy)
    with pytest.raises(LabError, match=r"token id \d+ of sequence \S+ outside the target vocab \(3\)") as e:
        fs.sequences("train")
    assert e.value.path.startswith(str(copy / "train-"))


def test_a_read_sequence_has_long_ids_and_a_bool_loss_mask(tmp_path):
    """Training indexes states by the mask: a uint8 one would index rows 0 and 1, not select."""
    with ShardWriter(tmp_path, "train", 0, ["s"], [2], 2, torch.float32) as w:
        w.put(0, _seq("s"))
    reader = ShardReader()
    (ref,) = reader.index(tmp_path / w.row["file"], 2)
    got = reader.read(ref)
    assert got.input_ids.dtype == torch.long and got.loss_mask.dtype == torch.bool
    assert got.loss_mask.tolist() == [False, True]
