"""Review (s75, h5): a feature set's recorded target vocab size is read in one place (`FeatureSet.vocab_size`),
which reads of sequences take as optional (unchecked without it) and the draft vocabulary's token counts as
required (refused in one line naming the manifest, the value as written)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data.shards import FeatureSet, Manifest, Sequence, ShardWriter
from drafter_lab.data.vocab import recorded_vocab_size
from drafter_lab.errors import LabError

ABSENT = object()


def features(directory, vocab_size, ids=(3, 7)):
    """One train shard of one sequence of `ids`, its manifest recording `vocab_size` (or none, ABSENT)."""
    directory.mkdir()
    n = len(ids)
    with ShardWriter(directory, "train", 0, ["s"], [n], 4, torch.float32) as w:
        w.put(0, Sequence("s", torch.tensor(ids, dtype=torch.int32), torch.ones(n, dtype=torch.uint8),
                          torch.zeros(n, 12), torch.zeros(n, 4)))
    target = {"fingerprint": "fp", "hidden_size": 4, **({} if vocab_size is ABSENT else {"vocab_size": vocab_size})}
    Manifest(target=target, aux_layer_ids=[1, 2, 3], dtype="float32", shards={"train": [w.row]}).save(directory)
    return FeatureSet(directory)


@pytest.mark.parametrize(("recorded", "want"), [(12, 12), (0, 0), (-3, -3), (ABSENT, None), ("12", None),
                                                (12.0, None), (True, None), (None, None)])
def test_the_recorded_vocab_size_is_an_integer_or_none(tmp_path, recorded, want):
    assert features(tmp_path / "f", recorded).vocab_size == want


def test_reads_check_token_ids_against_the_recorded_vocab_size_and_skip_the_check_without_one(tmp_path):
    checked = features(tmp_path / "checked", 5)
    with pytest.raises(LabError, match=r"token id 7 of sequence s outside the target vocab \(5\)$"):
        checked.sequences("train")
    unchecked = features(tmp_path / "unchecked", "5")
    assert unchecked.sequences("train")[0].input_ids.tolist() == [3, 7]


@pytest.mark.parametrize(("recorded", "shown"), [(0, "0"), ("12", "'12'"), (True, "True"), (ABSENT, "None")])
def test_counting_needs_a_positive_integer_and_names_the_value_as_written(tmp_path, recorded, shown):
    feat = features(tmp_path / "f", recorded)
    with pytest.raises(LabError) as e:
        recorded_vocab_size(feat)
    assert str(e.value) == (f"{feat.dir / 'manifest.json'}: 'target' records no vocab_size (an integer >= 1), got "
                            f"{shown}: the token counts of a draft vocabulary need it")
    assert recorded_vocab_size(features(tmp_path / "ok", 8)) == 8
