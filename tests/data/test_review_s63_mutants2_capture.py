"""Capture stores the aux states in the order of the ids it is given, and a shard's sequence read cut to
max_length is that sequence's first tokens wherever it lies in its shard (mutation audit, round 2)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data.capture import capture_states
from drafter_lab.data.shards import Sequence, ShardReader, ShardWriter, is_shard_name, shard_name
from drafter_lab.targets.hf import load_target


def test_aux_states_are_concatenated_in_the_order_of_the_ids_given(random_llama):
    """A target of 4 layers takes the default ids [2, 2, 1], out of layer order: capture must keep the order
    the drafter's fc and the spec engine (TargetRunner) read them in."""
    target = load_target(random_llama)
    ids = torch.randint(3, 200, (7,))
    got = {}
    capture_states(target, [("s", ids, torch.ones(7, dtype=torch.bool))], [4, 2, 5], torch.float32, 1,
                   lambda *a, **k: None, got.__setitem__)
    with torch.no_grad():
        want = target.model(ids[None], output_hidden_states=True).hidden_states
    assert torch.equal(got[0].aux_hidden, torch.cat([want[i][0] for i in (4, 2, 5)], -1))


def test_a_sequence_past_max_length_in_its_shard_reads_its_own_first_tokens(tmp_path):
    H, lengths = 2, [5, 7]
    seqs = [Sequence(f"s{j}", torch.arange(n) + 10 * j, torch.ones(n, dtype=torch.bool),
                     torch.full((n, 3 * H), float(j)), torch.full((n, H), float(j))) for j, n in enumerate(lengths)]
    with ShardWriter(tmp_path, "train", 0, [s.seq_id for s in seqs], lengths, H, torch.float32) as w:
        for j, s in enumerate(seqs):
            w.put(j, s)
    reader = ShardReader()
    second = reader.index(tmp_path / w.row["file"], H)[1]
    got = reader.read(second, max_length=3)
    assert torch.equal(got.input_ids, torch.tensor([10, 11, 12]))
    assert got.aux_hidden.shape == (3, 3 * H) and bool((got.final_hidden == 1.0).all())


def test_only_names_shard_name_gives_are_shard_names():
    """An --out without a manifest may hold our shards only: another file named like one is foreign."""
    assert is_shard_name(shard_name("train", 3)) and is_shard_name(shard_name("val", 123456))
    for name in ("train-00001", "train-1.safetensors", "train-00001.safetensors.tmp", "test-00001.safetensors", "train-0000x.safetensors"):
        assert not is_shard_name(name), name


def test_a_sequence_of_another_length_than_planned_is_refused_by_its_slot(tmp_path):
    """Written anyway it would spill into the next slot (or leave part of its own unwritten)."""
    H = 2
    with pytest.raises(ValueError, match="is not slot 0"), ShardWriter(tmp_path, "train", 0, ["a", "b"], [4, 4], H,
                                                                        torch.float32) as w:
        w.put(0, Sequence("a", torch.arange(5), torch.ones(5, dtype=torch.bool), torch.zeros(5, 3 * H), torch.zeros(5, H)))
    assert w.row is None
