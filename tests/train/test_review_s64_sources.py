"""Captured features' scan covers a held-out validation set too (a bad token id there is refused
before anything trains, not at the first validation), and an online run keeps validation states
within its budget exactly, records no default capture setting older runs lack, and notes a held-out
file's overlap with its train split only when there is one; the encoded hash names sequence ids."""

from __future__ import annotations

import pytest

from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target_head
from drafter_lab.train.sources import Captured


def test_the_scan_refuses_a_held_out_set_with_a_token_outside_the_vocab(peaked_llama, features, out_of_vocab_held_out):
    bad, shard = out_of_vocab_held_out
    head = load_target_head(peaked_llama)
    with pytest.raises(LabError, match=f"token id 999999 outside the target vocab \\({head.vocab_size}\\)") as e:
        Captured(peaked_llama, features, scan=True, target=head, val_data=bad)
    assert e.value.path == str(shard)
    Captured(peaked_llama, features, scan=False, target=head, val_data=bad)  # unscanned: refused per batch later


def test_online_keeps_validation_states_up_to_exactly_their_size(peaked_llama, features):
    """`online_val_cache_mb` bounds the states kept: the estimate is what they take (three aux layers
    and the final one per token), and a budget of exactly that keeps them, a byte less does not."""
    import torch

    from drafter_lab.data.capture import CaptureConfig
    from drafter_lab.train.sources import Online

    convs, capture = Manifest.load(features).source["conversations"], CaptureConfig(max_length=96, val_fraction=0.25)
    online = Online(peaked_llama, convs, capture, torch.device("cpu"), val_cache_mb=64)
    online.read_val(online.items["val"])
    size = sum(t.numel() * t.element_size() for s in online.kept.values() for t in (s.aux_hidden, s.final_hidden))
    assert size > 0 and len(online.kept) == len(online.items["val"])
    # settings at their defaults are absent from the identity, as in runs recorded before them
    assert not {"token_exact", "turns"} & set(online.identity())
    exact = Online(peaked_llama, convs, capture, torch.device("cpu"), val_cache_mb=size / 2**20)
    assert exact.kept == {}
    # a batch only part of which was kept is read whole, in its order
    first, more = exact.items["val"][:2], exact.items["val"][:3]
    exact.read_val(first)
    assert [s.seq_id for s in exact.read_val(more)] == [p.seq_id for p in more] and len(exact.kept) == 3
    assert Online(peaked_llama, convs, capture, torch.device("cpu"), val_cache_mb=(size - 1) / 2**20).kept is None


def test_a_held_out_file_sharing_nothing_with_the_train_split_is_not_noted(peaked_llama, features, held_out, capsys):
    import torch

    from drafter_lab.data.capture import CaptureConfig
    from drafter_lab.train.sources import Online

    convs = Manifest.load(features).source["conversations"]
    capsys.readouterr()
    online = Online(peaked_llama, convs, CaptureConfig(max_length=96, val_fraction=0.25), torch.device("cpu"),
                    val_data=held_out[0])
    assert online.held_out.items and "validation sequences are also train sequences" not in capsys.readouterr().err


def test_the_encoded_hash_names_the_sequences_ids():
    import torch

    from drafter_lab.train.sources import Prompt, encoded_sha256

    def prompt(seq_id, ids):
        return Prompt(seq_id, torch.tensor(ids), torch.ones(len(ids), dtype=torch.bool))

    one = encoded_sha256([prompt("a", [1, 2]), prompt("b", [3])])
    assert encoded_sha256([prompt("a", [1, 2]), prompt("c", [3])]) != one  # renamed: another split, ids
    assert encoded_sha256([prompt("a", [1, 2]), prompt("b", [3])]) == one
