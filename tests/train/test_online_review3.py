"""Online training (`train --conversations`) on files with nothing to train or validate on, and
validation sets that are the training data: one line naming the file, or a note, not a misleading
error or a silently inflated validation."""

from __future__ import annotations

import json
import shutil

import pytest

from drafter_lab.cli import main
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.train import sources
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=128, max_steps=2, batch_size=8, ttt_steps=2, eval_every=2, eval_batch_size=8,
                  threads=1, max_length=64)


def _train(peaked_llama, convs, out, *extra) -> int:
    return main(["train", "--target", str(peaked_llama), "--conversations", str(convs), "--draft-vocab-size", "128",
                 "--max-steps", "2", "--batch-size", "8", "--ttt-steps", "2", "--eval-every", "2",
                 "--eval-batch-size", "8", "--threads", "1", "--max-length", "64", "--out", str(out), *extra])


def _error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("tokenize")]
    assert len(err) == 1, err
    return err[0]


def test_a_file_without_assistant_turns_says_so_before_the_target_loads(peaked_llama, features, tmp_path, capsys,
                                                                         monkeypatch):
    convs = Manifest.load(features).source["conversations"]
    empty, unanswered = tmp_path / "empty.jsonl", tmp_path / "unanswered.jsonl"
    empty.write_text("")
    unanswered.write_text(json.dumps({"id": "q", "conversations": [{"role": "user", "content": "hi"}]}) + "\n")
    real = sources.load_target
    monkeypatch.setattr(sources, "load_target", lambda *a, **k: pytest.fail("loaded the target"))
    cases = [
        ((empty,), empty, "holds no conversations"),
        ((unanswered,), unanswered, "no conversation with an assistant turn (skipped: {'no_assistant_turn': 1})"),
        ((convs, "--val-data", str(empty)), empty, "holds no conversations"),
        ((convs, "--val-data", str(unanswered)), unanswered, "no conversation with an assistant turn"),
    ]
    for (data, *extra), named, message in cases:
        assert _train(peaked_llama, data, tmp_path / "out", *extra) == 2
        err = _error(capsys)
        assert message in err and str(named) in err, err
        assert not (tmp_path / "out").exists()
    monkeypatch.setattr(sources, "load_target", real)
    assert _train(peaked_llama, convs, tmp_path / "long", "--max-length", "8") == 2  # answers past max_length
    assert "no conversation keeps an assistant token within max_length=8" in _error(capsys)


def test_a_copy_of_the_training_data_is_no_validation_set(peaked_llama, features, tmp_path, capsys):
    convs = Manifest.load(features).source["conversations"]
    copy = tmp_path / "copy.jsonl"
    shutil.copy(convs, copy)
    assert _train(peaked_llama, convs, tmp_path / "online", "--val-data", str(copy)) == 2
    err = _error(capsys)
    assert "--val-data holds the same conversations as --conversations" in err and str(copy) in err
    shutil.copytree(features, tmp_path / "features")
    with pytest.raises(LabError, match="--val-data holds the same features as --data"):
        train(CFG, peaked_llama, features, tmp_path / "offline", val_data=tmp_path / "features")
    assert not (tmp_path / "online").exists() and not (tmp_path / "offline").exists()


def test_validation_sequences_the_drafter_trains_on_are_said(peaked_llama, features, tmp_path, capsys):
    convs = Manifest.load(features).source["conversations"]
    part = tmp_path / "part.jsonl"
    part.write_text("\n".join(open(convs).read().splitlines()[:10]) + "\n")
    assert _train(peaked_llama, convs, tmp_path / "run", "--val-data", str(part)) == 0
    assert f"{part}: 5 of 6 validation sequences are also train sequences of {convs}" in capsys.readouterr().err


def test_a_train_split_left_empty_says_so(peaked_llama, features, tmp_path, capsys):
    """One conversation, hashed into the val split at --val-fraction 0.5: nothing trains, whatever
    the vocabulary (not 'no train conversation has an assistant token')."""
    one = tmp_path / "one.jsonl"
    one.write_text(open(Manifest.load(features).source["conversations"]).readline())
    assert _train(peaked_llama, one, tmp_path / "run", "--val-fraction", "0.5") == 2
    err = _error(capsys)
    assert "no conversation falls in the train split (--val-fraction 0.5), nothing to train on" in err
    assert str(one) in err and not (tmp_path / "run").exists()
