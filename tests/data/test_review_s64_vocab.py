"""Mutation audit (review s64) of data.vocab: each refusal of a vocabulary file that engines would
index wrongly, a whole-vocabulary draft size, an empty train split, and what a vocab file says of itself."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from drafter_lab.data.shards import ShardReader
from drafter_lab.data.vocab import FORMAT, DraftVocab, count_train_tokens, vocab_from_counts
from drafter_lab.errors import LabError

V = 10


def t2d_of(*marked, dtype=torch.bool) -> torch.Tensor:
    t2d = torch.zeros(V, dtype=dtype)
    t2d[list(marked)] = 1
    return t2d


def d2t_of(*used) -> torch.Tensor:
    return torch.tensor(used, dtype=torch.int64) - torch.arange(len(used))


@pytest.mark.parametrize("d2t, t2d, refusal", [
    # a [1, N] d2t broadcast against arange(N) reads as N x N target ids
    (d2t_of(2, 5, 7).view(1, 3), t2d_of(2, 5, 7), r"d2t must be a 1-D integer tensor, got torch.int64 \[1, 3\]"),
    # 1.5 would be cut to 1 and name another token than the file says
    (d2t_of(2, 5, 7).double() + 0.5, t2d_of(2, 5, 7), r"d2t must be a 1-D integer tensor, got torch.float64 \[3\]"),
    # a byte mask holding 2 is no bool mask, however it reads as one
    (d2t_of(2, 5, 7), t2d_of(2, 5, 7, dtype=torch.uint8) * 2, r"t2d must be a 1-D bool mask, got torch.uint8 \[10\]"),
    # -1 would index the last target token, V its end
    (d2t_of(-1, 2, 5), t2d_of(2, 5, 9), r"d2t maps draft ids outside the target vocab \(0..9\)"),
    (d2t_of(2, 5, 10), t2d_of(2, 5), r"d2t maps draft ids outside the target vocab \(0..9\)"),
    (d2t_of(2, 2, 5), t2d_of(2, 5), "d2t maps two draft ids to the same target token"),
    # a token marked that no draft id proposes
    (d2t_of(2, 5), t2d_of(2, 5, 7), "d2t and t2d disagree: t2d marks 3 target tokens; of the 2 that d2t maps to, 0 are"),
])
def test_a_vocab_file_engines_would_read_wrongly_is_one_line(tmp_path, d2t, t2d, refusal):
    path = tmp_path / "v.safetensors"
    save_file({"d2t": d2t.contiguous(), "t2d": t2d}, str(path))
    with pytest.raises(LabError, match=f"^{path}: {refusal}"):
        DraftVocab.load(path)


def test_a_drafter_without_t2d_whose_d2t_leaves_the_target_vocab_is_refused():
    """t2d derived from a d2t past the target's tokens: the refusal, not an IndexError on the way."""
    with pytest.raises(LabError, match=r"d2t maps draft ids outside the target vocab \(0..9\)"):
        DraftVocab.of_drafter_file(d2t_of(0, 3, 12), None, 3, V, "model.safetensors")


def test_a_draft_vocab_as_large_as_the_target_vocab_is_the_whole_vocab():
    counts = torch.tensor([0, 4, 0, 1, 0, 0, 9, 0, 0, 2])
    v = vocab_from_counts(counts, V)
    assert torch.equal(v.used, torch.arange(V)) and bool(v.t2d.all())
    assert v.d2t.abs().sum() == 0  # the identity: what engines read a file without d2t as


def test_a_vocab_file_names_its_format_and_sizes(tmp_path):
    path = tmp_path / "v.safetensors"
    DraftVocab.from_used(torch.tensor([7, 2, 5]), V).save(path)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": FORMAT, "draft_vocab_size": "3", "target_vocab_size": "10"}
    assert DraftVocab.load(path).used.tolist() == [2, 5, 7]


def test_a_train_split_without_loss_masked_tokens_is_refused(features, monkeypatch):
    """Every position masked out (prompts alone): a vocabulary of padding ids alone is refused."""
    rows = ShardReader.rows

    def masked_out(self, path, key, a, b, f=None):
        t = rows(self, path, key, a, b, f)
        return torch.zeros_like(t) if key == "loss_mask" else t

    monkeypatch.setattr(ShardReader, "rows", masked_out)
    with pytest.raises(LabError, match="no loss-masked tokens in the train split: nothing to build a vocabulary from"):
        count_train_tokens(features)
