"""Review (s74, h11) of train/sources.py, gaps a mutation audit found: a held-out feature set with no
loss tokens is refused, a captured run's scan covers every shard and its ranks split them, an online
run records what it skipped and its held-out file's hash, and reads validation states with no cache;
a held-out file that is the training file itself (train()'s to refuse) is no copy for Online to
refuse, and its identity hashes both splits and says when answers were read token-exact. A captured
run validates on its val split, or on every sequence of a held-out feature set."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from drafter_lab.atomic import sha256_file
from drafter_lab.cli import main
from drafter_lab.data.capture import CaptureConfig
from drafter_lab.data.capture_config import ENCODED_HASH
from drafter_lab.data.conversations import conversations_sha256
from drafter_lab.data.shards import SPLITS, FeatureSet, Manifest
from drafter_lab.data.vocab import count_train_tokens
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target_head
from drafter_lab.train.sources import Captured, HeldOutConversations, Online, encoded_sha256

CAPTURE = CaptureConfig(max_length=96, val_fraction=0.25)  # as the `features` fixture was captured
CPU = torch.device("cpu")


def test_a_held_out_feature_set_without_loss_tokens_is_refused(peaked_llama, features, held_out, tmp_path):
    val = tmp_path / "val"
    shutil.copytree(held_out[1], val)
    manifest = json.loads((val / "manifest.json").read_text())
    for rows in manifest["shards"].values():
        for r in rows:
            r["loss_tokens"] = 0
    (val / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LabError) as e:
        Captured(peaked_llama, features, scan=False, target=load_target_head(peaked_llama), val_data=val)
    assert str(e.value) == f"{val}: no sequences with loss tokens: nothing to validate on"


def _out_of_vocab(features, dst, index: int):
    """A copy of `features` whose `index`-th shard (train ones first, as the scan lists them) holds token
    id 999999: (its directory, that shard)."""
    shutil.copytree(features, dst)
    manifest = Manifest.load(dst)
    shard = dst / [r["file"] for s in SPLITS for r in manifest.shards.get(s, [])][index]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["input_ids"][t["offsets"][:-1] + 1] = 999999
    save_file(t, str(shard), metadata=meta)
    return dst, shard


@pytest.mark.parametrize("index", [0, 1])
def test_the_scan_reads_every_shard_and_ranks_split_them(peaked_llama, features, tmp_path, index):
    """By default (one rank) every shard is scanned, held-out ones online too; of two ranks, the one
    the shard falls to finds it."""
    bad, shard = _out_of_vocab(features, tmp_path / "bad", index)
    head = load_target_head(peaked_llama)
    with pytest.raises(LabError, match="token id 999999 outside the target vocab") as e:
        Captured(peaked_llama, bad, scan=True, target=head)
    assert e.value.path == str(shard)
    with pytest.raises(LabError, match="token id 999999 outside the target vocab"):
        Captured(peaked_llama, bad, scan=True, target=head, rank=index % 2, world=2)
    Captured(peaked_llama, bad, scan=True, target=head, rank=1 - index % 2, world=2)  # the other rank's shards
    # An online run scans every shard of its held-out features by default too.
    convs = Manifest.load(features).source["conversations"]
    with pytest.raises(LabError, match="token id 999999 outside the target vocab"):
        Online(peaked_llama, convs, CAPTURE, CPU, val_data=bad)


def test_an_online_run_records_what_it_skipped(peaked_llama, features, tmp_path):
    convs = Manifest.load(features).source["conversations"]
    more = tmp_path / "more.jsonl"
    unanswered = {"id": "q", "conversations": [{"role": "user", "content": "hi"}]}
    more.write_text(open(convs).read() + json.dumps(unanswered) + "\n")
    online = Online(peaked_llama, more, CAPTURE, CPU, val_data=more)
    assert online.describe()["skipped"]["no_assistant_turn"] == 1
    assert online.describe()["val_skipped"]["no_assistant_turn"] == 1
    assert online.identity()["val"] == {"sha256": conversations_sha256(more)}  # what a resume must match


def test_the_training_file_as_its_own_held_out_file_is_not_refused_as_a_copy(peaked_llama, features):
    """The same path is train()'s to refuse (it names the flag); Online refuses only a copy elsewhere."""
    convs = Path(Manifest.load(features).source["conversations"])
    online = Online(peaked_llama, convs, CAPTURE, CPU, val_data=convs)
    assert isinstance(online.held_out, HeldOutConversations)
    assert len(online.items["val"]) == len(online.items["train"]) + len(Online(peaked_llama, convs, CAPTURE,
                                                                                CPU).items["val"])


def test_an_online_identity_hashes_both_splits_and_names_token_exact(peaked_llama, features, tmp_path):
    """A resume must see the val split's encoding too, and whether the answers were read token-exact."""
    convs = Path(Manifest.load(features).source["conversations"])
    online = Online(peaked_llama, convs, CAPTURE, CPU)
    # No cache (val_cache_mb 0): validation states are computed each time, none kept.
    assert [s.seq_id for s in online.read_val(online.items["val"][:2])] == [p.seq_id for p in online.items["val"][:2]]
    assert online.kept is None
    one = tmp_path / "one.jsonl"
    one.write_text(open(convs).readline())
    assert Online(peaked_llama, convs, CAPTURE, CPU, val_data=one).kept is None  # however small, unless asked
    # Cached, a batch computed before is returned as it was, not recomputed.
    cached = Online(peaked_llama, convs, CAPTURE, CPU, val_cache_mb=64)
    first = cached.read_val(cached.items["val"][:2])
    assert all(a is b for a, b in zip(cached.read_val(cached.items["val"][:2]), first, strict=True))
    assert online.identity()[ENCODED_HASH] == encoded_sha256([*online.items["train"], *online.items["val"]])
    sampled = tmp_path / "sampled.jsonl"
    assert main(["data", "regenerate", "--target", str(peaked_llama), "--conversations", str(convs), "--out",
                 str(sampled), "--temperature", "0.8", "--max-new-tokens", "8", "--seed", "1"]) == 0
    exact = Online(peaked_llama, sampled, replace(CAPTURE, token_exact=True), CPU)
    assert exact.identity()["token_exact"] is True and exact.val_sampled_at == 0.8
    # Re-tokenized, the sampled answers are not the target's own tokens: nothing replays.
    assert Online(peaked_llama, sampled, CAPTURE, CPU).val_sampled_at is None


def test_a_captured_run_validates_on_its_val_split_or_the_held_out_set(peaked_llama, features, held_out):
    head = load_target_head(peaked_llama)
    plain = Captured(peaked_llama, features, scan=True, target=head)
    assert [r.seq_id for r in plain.items["val"]] == [r.seq_id for r in FeatureSet(features).require("val")]
    assert plain.reads == {"train": None, "val": None}  # the loop reads the shards itself
    assert torch.equal(plain.token_counts(), count_train_tokens(features))
    assert plain.identity() == {"manifest_sha256": sha256_file(features / "manifest.json")}
    assert plain.describe() == {"dir": str(features)}
    held = Captured(peaked_llama, features, scan=False, target=head, val_data=held_out[1])
    val = FeatureSet(held_out[1])
    assert [r.seq_id for r in held.items["val"]] == [r.seq_id for s in SPLITS for r in val.index(s)]
