"""Mutation audit (review s73, h10) of data.vocab: a drafter file's mapping read as engines read it,
a t2d stored as 0/1 integers, the file each refusal names, and the draft-size bounds."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data.vocab import DraftVocab, check_size, compare_vocabs, vocab_of_drafter
from drafter_lab.errors import LabError

V = 10


def d2t_of(*used) -> torch.Tensor:
    return torch.tensor(used, dtype=torch.int64) - torch.arange(len(used))


def test_a_drafter_file_without_t2d_marks_every_token_d2t_maps_to_the_first_and_last_included():
    v = DraftVocab.of_drafter_file(d2t_of(0, 4, 9), None, 3, V, "model.safetensors")
    assert torch.nonzero(v.t2d).flatten().tolist() == [0, 4, 9]
    assert v.used.tolist() == [0, 4, 9]


def test_a_whole_vocab_drafter_file_without_d2t_or_t2d_is_the_identity():
    v = DraftVocab.of_drafter_file(None, None, V, V, "model.safetensors")
    assert v.used.tolist() == list(range(V)) and bool(v.t2d.all())


def test_a_drafter_file_with_both_tensors_keeps_its_own_t2d():
    t2d = torch.zeros(V, dtype=torch.uint8)
    t2d[[1, 2]] = 1
    v = DraftVocab.of_drafter_file(d2t_of(1, 2), t2d, 2, V, "model.safetensors")
    assert v.t2d.dtype == torch.bool and torch.nonzero(v.t2d).flatten().tolist() == [1, 2]


def test_a_t2d_of_zeros_and_ones_in_an_integer_dtype_reads_as_the_mask():
    """Some exports store t2d as int64 0/1: the bounds 0 and 1 are both a mask's values."""
    t2d = torch.zeros(V, dtype=torch.int64)
    t2d[[0, 3, 9]] = 1
    v = DraftVocab.checked(d2t_of(0, 3, 9), t2d, "v.safetensors")
    assert v.used.tolist() == [0, 3, 9] and v.t2d.dtype == torch.bool
    whole = DraftVocab.checked(torch.zeros(V, dtype=torch.int64), torch.ones(V, dtype=torch.int64), "v.safetensors")
    assert bool(whole.t2d.all())  # all ones: min == max is still a mask


@pytest.mark.parametrize("bad", [-1, 2])
def test_a_t2d_outside_zero_one_is_refused(bad):
    t2d = torch.zeros(V, dtype=torch.int64)
    t2d[[0, 3]] = 1
    t2d[5] = bad
    with pytest.raises(LabError, match=r"^t2d.safetensors: t2d must be a 1-D bool mask"):
        DraftVocab.checked(d2t_of(0, 3), t2d, "d2t.safetensors", "t2d.safetensors")


def test_a_sharded_drafters_t2d_problems_name_the_file_holding_t2d():
    with pytest.raises(LabError, match=r"^t2d.safetensors: t2d has 9 entries, the config's vocab_size is 10"):
        DraftVocab.of_drafter_file(d2t_of(0, 3), torch.zeros(9, dtype=torch.bool), 2, V, "d2t.safetensors",
                                   "t2d.safetensors")
    with pytest.raises(LabError, match=r"^d2t.safetensors: d2t has 2 entries, the config's draft_vocab_size is 3"):
        DraftVocab.of_drafter_file(d2t_of(0, 3), None, 3, V, "d2t.safetensors", "t2d.safetensors")
    with pytest.raises(LabError, match=r"^t2d.safetensors: t2d must be a 1-D bool mask, got torch.float32"):
        DraftVocab.of_drafter_file(d2t_of(0, 3), torch.zeros(V), 2, V, "d2t.safetensors", "t2d.safetensors")


def test_without_a_second_file_t2d_problems_name_the_one_file():
    with pytest.raises(LabError, match=r"^model.safetensors: t2d has 9 entries"):
        DraftVocab.of_drafter_file(d2t_of(0, 3), torch.zeros(9, dtype=torch.bool), 2, V, "model.safetensors")
    with pytest.raises(LabError, match=r"^model.safetensors: t2d must be a 1-D bool mask"):
        DraftVocab.checked(d2t_of(0, 3), torch.zeros(V), "model.safetensors")


def test_a_drafter_file_without_d2t_is_refused_unless_it_drafts_the_whole_vocab():
    with pytest.raises(LabError, match=r"^model.safetensors: no 'd2t' tensor, yet the draft vocab \(9\) is not the"):
        DraftVocab.of_drafter_file(None, None, 9, V, "model.safetensors")


@pytest.mark.parametrize("size, vocab_size, ok", [(1, None, True), (1, 1, True), (10, 10, True), (0, None, False),
                                                  (0, 10, False), (11, 10, False), (10 ** 9, None, True)])
def test_the_draft_size_bounds(size, vocab_size, ok):
    if ok:
        check_size(size, vocab_size)
        return
    bounds = ">= 1" if vocab_size is None else r"in 1..10 \(the target vocab size\)"
    with pytest.raises(LabError, match=rf"^--size must be {bounds}, got {size}$"):
        check_size(size, vocab_size, "--size")


def test_save_itself_refuses_to_replace_a_file_that_is_not_a_vocab(tmp_path):
    """Not only the CLI: any caller of save keeps someone's other file."""
    other = tmp_path / "manifest.json"
    other.write_text('{"keep": true}')
    with pytest.raises(LabError, match=rf"^{other}: exists and is not a draft vocabulary"):
        DraftVocab.from_used(torch.tensor([1, 2]), V).save(other)
    assert other.read_text() == '{"keep": true}'
    path = tmp_path / "v.safetensors"
    DraftVocab.from_used(torch.tensor([1, 2]), V).save(path)
    DraftVocab.from_used(torch.tensor([0, 5, 7]), V).save(path)  # a vocab is rebuilt in place
    assert DraftVocab.load(path).used.tolist() == [0, 5, 7]


def test_compare_lists_ten_of_each_by_default():
    a = DraftVocab.from_used(torch.arange(0, 12), 40)
    b = DraftVocab.from_used(torch.arange(20, 32), 40)
    r = compare_vocabs(a, b)
    assert [g["position"] for g in r["largest_gaps"]] == list(range(10))  # all gaps 20: ties by position
    assert r["only_a"] == list(range(10)) and r["only_b"] == list(range(20, 30))
    assert r["only_a_count"] == r["only_b_count"] == 12


@pytest.mark.parametrize("used", [(3, V), (-1, 3)])
def test_a_drafter_file_without_t2d_mapping_just_past_either_end_is_refused(used):
    """Target id V (one past the end) or -1: the refusal, not an IndexError or a wrapped index."""
    with pytest.raises(LabError, match=r"^model.safetensors: d2t maps draft ids outside the target vocab \(0..9\)"):
        DraftVocab.of_drafter_file(d2t_of(*used), None, 2, V, "model.safetensors")


def test_a_loaded_drafters_buffers_read_as_its_vocab():
    drafter = torch.nn.Module()
    drafter.register_buffer("d2t", d2t_of(2, 5).int())
    drafter.register_buffer("t2d", torch.zeros(V, dtype=torch.uint8).index_fill_(0, torch.tensor([2, 5]), 1))
    v = vocab_of_drafter(drafter)
    assert v.used.tolist() == [2, 5] and v.d2t.dtype == torch.int64 and v.t2d.dtype == torch.bool
