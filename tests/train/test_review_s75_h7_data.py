"""train.data at its edges: the target's top-1 and log-partition, which sequences are examples, padding,
device moves, the epoch plan's rows and order, and the prefetcher's shutdown."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from drafter_lab.data.shards import Sequence
from drafter_lab.train import data
from drafter_lab.train.data import (
    Batch,
    Example,
    Examples,
    Prefetcher,
    collate,
    micro_batches,
    pack_padded,
    plan_epoch,
    shard_batch,
    target_top1,
)

H, V = 4, 11


def _seq(n: int, seed: int) -> Sequence:
    g = torch.Generator().manual_seed(seed)
    return Sequence(f"s{seed}", torch.randint(V, (n,), generator=g, dtype=torch.int32), torch.arange(n) % 2 == 0,
                    torch.randn(n, 3 * H, generator=g), torch.randn(n, H, generator=g))


HEAD = torch.randn(V, H, generator=torch.Generator().manual_seed(9))


def test_top1_and_log_partition_cover_every_row_in_chunks():
    h = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    logits = h @ HEAD.T
    top1, logz = target_top1(h, HEAD, 0.5, chunk=2)  # chunks of 2, 2 and 1
    assert torch.equal(top1, logits.argmax(-1))
    torch.testing.assert_close(logz, torch.logsumexp(logits / 0.5, -1))
    # greedy (the default): no log-partition, which at temperature 0 would be inf
    assert target_top1(h, HEAD)[1] is None and target_top1(h, HEAD, 0.0)[1] is None


def test_sequences_of_three_tokens_or_more_are_examples_cut_to_max_length():
    seqs = [_seq(2, 0), _seq(3, 1), _seq(9, 2), _seq(4, 3)]
    ex = Examples(seqs, HEAD, max_length=6)
    assert len(ex) == 3 and ex.lengths == [3, 6, 4] and [s.seq_id for s in ex.items] == ["s1", "s2", "s3"]
    got = ex.take([1, 0])
    assert [len(e) for e in got] == [6, 3] and all(e.logz is None for e in got)  # greedy by default
    assert torch.equal(got[0].input_ids, seqs[2].input_ids[:6].long()) and got[0].input_ids.dtype == torch.long
    assert torch.equal(got[0].top1, (seqs[2].final_hidden[:6] @ HEAD.T).argmax(-1))
    hot = Examples(seqs, HEAD, max_length=6, temperature=0.5).take([0])[0]
    torch.testing.assert_close(hot.logz, torch.logsumexp(seqs[1].final_hidden @ HEAD.T / 0.5, -1))


def test_items_of_another_kind_are_read_by_the_given_reader_and_their_top1_computed_once(monkeypatch):
    """An online run's prompts: `read` turns them into sequences; the top-1 is kept across batches."""
    seqs = {"a": _seq(5, 4), "b": _seq(7, 5)}
    reads, tops = [], []
    top1 = data.target_top1
    monkeypatch.setattr(data, "target_top1", lambda *a, **k: tops.append(1) or top1(*a, **k))
    ex = Examples(["a" * 5, "b" * 7], HEAD, max_length=8,
                  read=lambda items: reads.append(items) or [seqs[it[0]] for it in items])
    assert ex.lengths == [5, 7]
    first, again = ex.take([0, 1]), ex.take([1, 0])
    assert reads == [["aaaaa", "bbbbbbb"], ["bbbbbbb", "aaaaa"]] and len(tops) == 2
    assert torch.equal(first[1].top1, again[0].top1) and torch.equal(first[0].aux_hidden, seqs["a"].aux_hidden)


def _example(n: int, seed: int, logz: bool, dtype=torch.float32) -> Example:
    s = _seq(n, seed)
    return Example(s.input_ids.long(), s.loss_mask, s.aux_hidden.to(dtype), s.final_hidden.to(dtype),
                   torch.arange(n), torch.rand(n) if logz else None)


@pytest.mark.parametrize("logz", [False, True])
def test_collate_right_pads_one_or_more_examples(logz):
    one = collate([_example(4, 0, logz)])
    assert one.input_ids.shape == (1, 4) and (one.logz is None) == (not logz)
    a, b = _example(3, 1, logz, torch.bfloat16), _example(5, 2, logz, torch.bfloat16)
    batch = collate([a, b])
    assert batch.aux_hidden.dtype == batch.final_hidden.dtype == torch.float32  # bf16 features train in fp32
    assert batch.aux_hidden.shape == (2, 5, 3 * H) and batch.final_hidden.shape == (2, 5, H)
    assert torch.equal(batch.aux_hidden[0, :3], a.aux_hidden.float()) and not batch.aux_hidden[0, 3:].any()
    assert torch.equal(batch.final_hidden[1], b.final_hidden.float()) and torch.equal(batch.top1[0], torch.tensor([0, 1, 2, 0, 0]))
    assert torch.equal(batch.loss_mask[0], torch.tensor([True, False, True, False, False]))
    assert torch.equal(batch.input_ids[1], b.input_ids) and not batch.input_ids[0, 3:].any()
    if logz:
        assert torch.equal(batch.logz[0], torch.cat([a.logz, torch.zeros(2)]))


@pytest.mark.parametrize("logz", [False, True])
def test_a_batch_moves_every_tensor_and_keeps_a_missing_logz(logz):
    moved = collate([_example(3, 0, logz), _example(4, 1, logz)]).to("meta")
    assert all(t.device.type == "meta" for t in vars(moved).values() if t is not None)
    assert (moved.logz is None) == (not logz)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
@pytest.mark.parametrize("logz", [False, True])
def test_a_pinned_batch_is_page_locked_and_keeps_a_missing_logz(logz):
    pinned = collate([_example(3, 0, logz)]).pin()
    assert isinstance(pinned, Batch) and all(t.is_pinned() for t in vars(pinned).values() if t is not None)
    assert (pinned.logz is None) == (not logz)


@pytest.mark.parametrize("logz", [False, True])
def test_pin_page_locks_each_tensor_there_is(logz, monkeypatch):
    """The same on a machine without CUDA, where page-locking itself is refused: a stand-in copies."""
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())
    batch = collate([_example(3, 0, logz)])
    out = batch.pin()
    tensors = [t for t in vars(batch).values() if t is not None]
    assert len(pinned) == len(tensors) == 5 + logz and (out.logz is None) == (not logz)
    assert all(p is t for p, t in zip(pinned, tensors))
    assert all(torch.equal(a, b) and a is not b for a, b in zip([t for t in vars(out).values() if t is not None], tensors))


LENGTHS = [3 + (i * 37) % 61 for i in range(130)]


@pytest.mark.parametrize("batch_size, batch_tokens", [(1, 0), (4, 0), (7, 0), (4, 1), (4, 200), (0, 50)])
def test_an_epoch_plans_every_row_once(batch_size, batch_tokens):
    plan = plan_epoch(LENGTHS, batch_size, batch_tokens, 3, 2)
    assert sorted(i for b in plan for i in b) == list(range(len(LENGTHS)))
    if batch_tokens == 0:  # by count: full batches but one
        assert sorted(len(b) for b in plan)[1:] == [batch_size] * (len(plan) - 1)
    else:  # by padded tokens: at most batch_tokens but a lone longer row
        assert all(len(b) == 1 or len(b) * max(LENGTHS[i] for i in b) <= batch_tokens for b in plan)
    if batch_tokens == 1:
        assert all(len(b) == 1 for b in plan)
    assert plan == plan_epoch(LENGTHS, batch_size, batch_tokens, 3, 2)


def test_each_seed_and_epoch_plans_its_own_order():
    plans = [plan_epoch(LENGTHS, 1, 0, seed, epoch) for seed in (0, 1, 2) for epoch in (0, 1)]
    assert len({json.dumps(p) for p in plans}) == len(plans)


@pytest.mark.parametrize("batch_size, batch_tokens, epoch, digest", [
    (1, 0, 0, "1cb15b6de70555b9"), (2, 0, 1, "a45e624fe5228930"), (3, 200, 0, "da8665495850c769")])
def test_the_epoch_plan_is_the_one_runs_were_made_with(batch_size, batch_tokens, epoch, digest):
    """A resume replays the plan to find its place, and a study's cached drafter is keyed by its config, not
    the code: a change to the order (a window's size, the seed's mix) would mix two orders in one run."""
    plan = plan_epoch(LENGTHS, batch_size, batch_tokens, 7, epoch)
    assert hashlib.sha256(json.dumps(plan).encode()).hexdigest()[:16] == digest


def test_padded_parts_hold_up_to_their_cap_exactly():
    lengths = [4, 4, 4, 6, 6, 9]
    assert pack_padded(list(range(6)), lengths, 12) == [[0, 1, 2], [3, 4], [5]]  # 3 x 4 = 12 fits, 2 x 6 fits
    assert pack_padded(list(range(6)), lengths, 11) == [[0, 1], [2], [3], [4], [5]]
    assert pack_padded([5, 0, 1], lengths, 18) == [[5, 0], [1]]  # a part pads to its longest row
    assert pack_padded([], lengths, 12) == []


def test_micro_batches_find_a_smallest_cap_one_token_above_a_failed_one():
    """Caps 6 and 7 need three parts and 8 fits two: a search stepping past 7 by two would settle on 9."""
    assert micro_batches([0, 1, 2, 3], [3, 3, 3, 4], 2) == [[0, 1], [2, 3]]  # 2 x 3 and 2 x 4, not 3 x 3 and 4


def test_each_rank_takes_every_worlds_row_from_its_own():
    rows = [10, 11, 12, 13, 14, 15, 16]
    assert [shard_batch(rows, r, 3) for r in range(3)] == [[10, 13, 16], [11, 14], [12, 15]]
    assert shard_batch([10], 1, 2) == []  # a batch of fewer rows than ranks leaves a rank none


def test_a_closed_prefetcher_loads_nothing_more():
    p = Prefetcher(lambda rows: rows)
    assert p.get("a", [1], ("b", [2])) == [1]
    p.close()
    with pytest.raises(RuntimeError, match="shutdown"):
        p.get("c", [3])
