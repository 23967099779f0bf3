"""The batched TTT objective against a position-by-position decode with draft_step."""

from __future__ import annotations

import math

import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.train.data import Example, collate, plan_epoch, target_top1
from drafter_lab.train.metrics import summarize
from drafter_lab.train.ttt import CE_SUM, TTTObjective

V, N, H, HT, K = 53, 17, 32, 24, 4


def setup(seed=0):
    cfg = DrafterConfig(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, draft_vocab_size=N, target_vocab_size=V, target_hidden_size=HT,
                        aux_layer_ids=[2, 4, 5], rope_theta=100.0)
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg).double()
    used = torch.sort(torch.randperm(V)[:N]).values
    d.d2t.copy_(used - torch.arange(N))
    d.t2d[used] = True
    head = torch.randn(V, HT, dtype=torch.float64)
    # make the target's favourite tokens mostly drafted, but not all (some positions drop out)
    head[used] *= 1.5
    examples = []
    for T in (13, 9, 11):
        final = torch.randn(T, HT, dtype=torch.float64)
        examples.append(Example(
            input_ids=torch.randint(0, V, (T,)),
            loss_mask=torch.rand(T) < 0.7,
            aux_hidden=torch.randn(T, 3 * HT, dtype=torch.float64),
            final_hidden=final,
            top1=target_top1(final, head),
        ))
    return d, head, used, examples


@torch.no_grad()
def naive_counts(d: Eagle3Drafter, head: torch.Tensor, used: torch.Tensor, e: Example, decay: float):
    """Decode every position with a KV cache, one draft step at a time."""
    T = len(e)
    counts = torch.zeros(K, 6, dtype=torch.float64)
    kc, vc = d.new_kv_cache(1, T + K)
    h0 = []
    for t in range(T - 1):  # prefill: step 0 at t embeds x_{t+1}
        h, _, _ = d.draft_step(d.embed(e.input_ids[t + 1:t + 2]), e.aux_hidden[t:t + 1], torch.tensor([t]), kc, vc,
                               torch.tensor([t]), topk=1)
        h0.append(h)
    for t in range(T - 2):
        k2, v2 = kc.clone(), vc.clone()
        k2[:, :, t + 1:] = 0
        v2[:, :, t + 1:] = 0
        h, prev_ok = h0[t], True
        for k in range(K):
            s = 1 + k
            if t + s > T - 1:
                break
            if k > 0:
                h, _, _ = d.draft_step(d.embed(e.input_ids[t + s:t + s + 1]), h, torch.tensor([t + k]), k2, v2,
                                       torch.tensor([t + k]), topk=1)
            logits = d.logits(h)[0]
            correct = bool(used[logits.argmax()] == e.top1[t + s])
            if t + s + 1 <= T - 1 and e.loss_mask[t + s + 1]:
                teacher = torch.log_softmax(e.final_hidden[t + s] @ head[used].T, -1)
                in_vocab = bool(d.t2d[e.top1[t + s]])
                ce = float(-(teacher.exp() * torch.log_softmax(logits, -1)).sum())
                counts[k] += torch.tensor([1, in_vocab, ce * in_vocab, correct, prev_ok, prev_ok and correct],
                                          dtype=torch.float64)
            prev_ok = prev_ok and correct
    return counts


def test_batched_objective_equals_decoding_position_by_position():
    d, head, used, examples = setup()
    obj = TTTObjective(d, head[used], K, 0.8)
    loss, counts = obj(collate(examples))
    want = sum(naive_counts(d, head, used, e, 0.8) for e in examples)
    integer_cols = [c for c in range(6) if c != CE_SUM]
    assert torch.equal(counts[:, integer_cols], want[:, integer_cols])
    torch.testing.assert_close(counts[:, CE_SUM], want[:, CE_SUM], rtol=1e-9, atol=1e-9)
    want_loss = sum(0.8 ** k * want[k, CE_SUM] / want[k, 1] for k in range(K))
    assert math.isclose(loss.item(), float(want_loss), rel_tol=1e-9)
    assert want[:, 1].sum() < want[:, 0].sum()  # some positions dropped: target top-1 outside the vocab
    assert (want[:, 4] < want[:, 0]).any()  # cond_acc is conditional on something


def test_padding_does_not_leak():
    d, head, used, examples = setup(seed=1)
    obj = TTTObjective(d, head[used], K, 0.8)
    _, together = obj(collate(examples))
    alone = sum(obj(collate([e]))[1] for e in examples)
    torch.testing.assert_close(together, alone, rtol=1e-9, atol=1e-9)


def test_summarize_is_ratios_of_sums():
    c = torch.zeros(3, 6, dtype=torch.float64)
    c[:, 0] = torch.tensor([10, 10, 10])  # valid
    c[:, 1] = torch.tensor([8, 8, 8])  # in loss
    c[:, 2] = torch.tensor([16, 8, 4])  # ce sum
    c[:, 3] = torch.tensor([5, 4, 2])  # correct
    c[:, 4] = torch.tensor([10, 5, 4])  # cond den
    c[:, 5] = torch.tensor([5, 4, 2])  # cond num
    m = summarize(c)
    assert (m["loss_0"], m["loss_1"], m["loss_2"]) == (2.0, 1.0, 0.5)
    assert (m["acc_0"], m["cond_acc_1"], m["cond_acc_2"]) == (0.5, 0.8, 0.5)
    assert math.isclose(m["simulated_accept_len"], 0.5 + 0.5 * 0.8 + 0.5 * 0.8 * 0.5)


def test_epoch_plan_is_deterministic_and_covers_every_sequence():
    lengths = [int(x) for x in torch.randint(3, 200, (103,), generator=torch.Generator().manual_seed(0))]
    a = plan_epoch(lengths, 8, 0, seed=3, epoch=1)
    assert a == plan_epoch(lengths, 8, 0, seed=3, epoch=1)
    assert a != plan_epoch(lengths, 8, 0, seed=3, epoch=2)
    assert sorted(i for b in a for i in b) == list(range(103))
    tok = plan_epoch(lengths, 8, 600, seed=3, epoch=0)
    assert sorted(i for b in tok for i in b) == list(range(103))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 600 for b in tok)
