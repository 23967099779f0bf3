"""Review s64 suspect: a draft vocabulary of 0 tokens is refused where it is read."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.errors import LabError


def test_an_empty_vocab_file_is_refused_in_one_line_naming_it(tmp_path):
    """N = 0 passed every check (nothing maps outside the target, nothing twice, t2d marks none): a
    drafter built on it would have an lm_head of 0 rows and propose nothing."""
    path = tmp_path / "vocab.safetensors"
    DraftVocab(d2t=torch.zeros(0, dtype=torch.int64), t2d=torch.zeros(16, dtype=torch.bool)).save(path)
    with pytest.raises(LabError) as e:
        DraftVocab.load(path)
    assert str(e.value) == f"{path}: d2t is empty: a draft vocabulary of 0 tokens"


def test_a_one_token_vocab_still_loads(tmp_path):
    path = tmp_path / "vocab.safetensors"
    DraftVocab.from_used(torch.tensor([5]), 16).save(path)
    assert DraftVocab.load(path).used.tolist() == [5]
