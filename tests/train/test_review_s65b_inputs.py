"""A draft vocab given to train() that does not fit the target is refused before anything is written
(mutation audit, s65 second pass)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drafter_lab.data.vocab import vocab_from_counts
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=128, batch_size=4, max_steps=1, ttt_steps=1, warmup_steps=0, threads=1)


def test_a_vocab_of_another_target_or_inconsistent_is_refused(tmp_path, peaked_llama, features):
    size = load_target(peaked_llama, tokenizer=False).vocab_size
    other = vocab_from_counts(torch.ones(size + 1), 128)
    with pytest.raises(LabError, match=f"draft vocab maps a {size + 1}-token target vocab, the target has {size}"):
        train(CFG, peaked_llama, features, tmp_path / "other", vocab=other)
    good = vocab_from_counts(torch.ones(size), 128)
    short = dataclasses.replace(good, d2t=good.d2t[:127])
    with pytest.raises(LabError, match="t2d marks 128 tokens, d2t has 127"):
        train(CFG, peaked_llama, features, tmp_path / "short", vocab=short)
    assert not (tmp_path / "other").exists() and not (tmp_path / "short").exists()
