"""The batched TTT objective against a position-by-position decode with draft_step, and its sampled
acceptance against the speculative-sampling primitives on dense full-vocab distributions."""

from __future__ import annotations

import math

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.spec.sampling import (
    accept_probability,
    probs_from_logits,
    residual,
    scatter_dist,
)
from drafter_lab.train import ttt
from drafter_lab.train.data import Example, collate, plan_epoch, target_top1
from drafter_lab.train.metrics import summarize
from drafter_lab.train.ttt import (
    CE_SUM,
    COND_DEN,
    COND_NUM,
    N_COLS,
    R_CYC,
    R_TOK,
    S_DEN,
    S_NUM,
    TTTObjective,
    proposal,
    realized_accept_rate,
    replay_roots,
    replay_roots_reference,
)

V, N, H, HT, K = 53, 17, 32, 24, 4


def drafter_and_head(cfg: DrafterConfig, seed: int, scale: float):
    """(A seeded random float64 drafter of `cfg` whose draft vocab is random target tokens, those sorted
    ids, a random target head whose rows for them are `scale` times longer)."""
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg).double()
    v, n = cfg.target_vocab_size, cfg.draft_vocab_size
    used = torch.sort(torch.randperm(v)[:n]).values
    d.d2t.copy_(used - torch.arange(n))
    d.t2d[used] = True
    head = torch.randn(v, cfg.target_hidden_size, dtype=torch.float64)
    head[used] *= scale
    return d, used, head


def setup(seed=0, temperature=0.0, own_tokens=False):
    """A random drafter and examples; `own_tokens`: each token sampled from the target at `temperature`
    (the held-out text a replay reads), else uniform."""
    cfg = DrafterConfig(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, draft_vocab_size=N, target_vocab_size=V, target_hidden_size=HT,
                        aux_layer_ids=[2, 4, 5], rope_theta=100.0)
    # the target's favourite tokens mostly drafted, but not all (some positions drop out)
    d, used, head = drafter_and_head(cfg, seed, 1.5)
    examples = []
    for T in (13, 9, 11):
        final = torch.randn(T, HT, dtype=torch.float64)
        top1, logz = target_top1(final, head, temperature)
        ids = torch.randint(0, V, (T,))
        if own_tokens:
            ids[1:] = torch.multinomial(probs_from_logits(final[:-1] @ head.T, temperature), 1)[:, 0]
        examples.append(Example(
            input_ids=ids,
            loss_mask=torch.rand(T) < 0.7,
            aux_hidden=torch.randn(T, 3 * HT, dtype=torch.float64),
            final_hidden=final,
            top1=top1,
            logz=logz,
        ))
    return d, head, used, examples


@torch.no_grad()
def naive_counts(d: Eagle3Drafter, head: torch.Tensor, used: torch.Tensor, e: Example, decay: float,
                 temperature: float = 0.0, realized: dict | None = None):
    """Decode every position with a KV cache, one draft step at a time; at a temperature, a sampled
    chain's acceptance from dense full-vocab p and q (the engine's primitives), and in `realized`
    {(k, t): min(p, q)(x) / p(x)} at each loss token x."""
    T = len(e)
    counts = torch.zeros(K, N_COLS, dtype=torch.float64)
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
        h, prev_ok, reach = h0[t], True, 1.0
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
                counts[k, :6] += torch.tensor([1, in_vocab, ce * in_vocab, correct, prev_ok, prev_ok and correct],
                                              dtype=torch.float64)
            prev_ok = prev_ok and correct
            if temperature > 0:
                p = probs_from_logits(e.final_hidden[t + s] @ head.T, temperature)
                top, idx = logits.topk(ttt.SAMPLE_TOPK)
                q = scatter_dist(used[idx][None], torch.softmax(top / temperature, -1)[None], V)[0]
                before, reach = reach, reach * float(torch.minimum(p, q).sum())
                if t + s + 1 <= T - 1 and e.loss_mask[t + s + 1]:
                    counts[k, S_DEN] += before
                    counts[k, S_NUM] += reach
                    if realized is not None:
                        x = e.input_ids[t + s + 1]
                        realized[k, t] = float(torch.minimum(p, q)[x] / p[x])
    return counts


def test_batched_objective_equals_decoding_position_by_position():
    d, head, used, examples = setup()
    obj = TTTObjective(d, head[used], K, 0.8)
    loss, counts = obj(collate(examples))
    want = sum(naive_counts(d, head, used, e, 0.8) for e in examples)
    integer_cols = [c for c in range(N_COLS) if c != CE_SUM]
    assert torch.equal(counts[:, integer_cols], want[:, integer_cols])
    torch.testing.assert_close(counts[:, CE_SUM], want[:, CE_SUM], rtol=1e-9, atol=1e-9)
    want_loss = sum(0.8 ** k * want[k, CE_SUM] / want[k, 1] for k in range(K))
    assert math.isclose(loss.item(), float(want_loss), rel_tol=1e-9)
    assert want[:, 1].sum() < want[:, 0].sum()  # some positions dropped: target top-1 outside the vocab
    assert (want[:, 4] < want[:, 0]).any()  # cond_acc is conditional on something


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_sampled_acceptance_equals_dense_speculative_sampling_position_by_position(temperature):
    d, head, used, examples = setup(seed=2, temperature=temperature)
    obj = TTTObjective(d, head[used], K, 0.8, temperature)
    _, counts = obj(collate(examples))
    want = sum(naive_counts(d, head, used, e, 0.8, temperature) for e in examples)
    torch.testing.assert_close(counts[:, :S_DEN], want[:, :S_DEN], rtol=1e-9, atol=1e-9)
    # p and q are fp32 on both sides (target_top1's logits, probs_from_logits)
    torch.testing.assert_close(counts[:, S_DEN:], want[:, S_DEN:], rtol=1e-5, atol=1e-6)
    assert 0 < want[0, S_NUM] < want[0, S_DEN]  # some drafts are rejected, some accepted
    assert (want[1:, S_DEN] < want[1:, 0]).all()  # deeper steps are reached with probability < 1
    # Without the log-partition (training batches) nothing is measured.
    plain = collate(examples)
    plain.logz = None
    assert not obj(plain)[1][:, [S_DEN, S_NUM]].any()


def test_sampled_acceptance_tends_to_greedy_as_the_temperature_falls():
    d, head, used, examples = setup(seed=3, temperature=1e-3)
    _, counts = TTTObjective(d, head[used], K, 0.8, 1e-3)(collate(examples))
    # counts over ~20 positions each; a near-tie between two logits still splits its position a little
    torch.testing.assert_close(counts[:, [S_DEN, S_NUM]], counts[:, [COND_DEN, COND_NUM]], rtol=0, atol=1e-2)
    assert counts[:, COND_NUM].sum() > 0


def _cycles(t: int, end: int, realized: dict, steps: int, memo: dict) -> float:
    """Expected verify steps from root t until the span's last token `end` is out."""
    if t >= end - 1:
        return 0.0
    if t not in memo:
        out, reach = 1.0, 1.0
        for j in range(steps):
            r = realized.get((j, t), 0.0)
            out += reach * (1 - r) * _cycles(t + j + 1, end, realized, steps, memo)
            reach *= r
        memo[t] = out + reach * _cycles(t + steps + 1, end, realized, steps, memo)
    return memo[t]


def expected_verify_steps(realized: dict, mask: list[bool], steps: int) -> tuple[int, float]:
    """(tokens, expected verify steps) of a `steps`-step chain served over one sequence, by backward
    recursion over each assistant span: steps(t) = 1 + sum_j P(j accepted | root t) steps(t + j + 1)."""
    spans, a = [], None
    for i, m in enumerate([*mask, False]):
        if m and a is None:
            a = max(i, 1)  # the first token of a sequence is never generated
        elif not m and a is not None:
            spans.append((a, i - 1))
            a = None
    tokens, total = 0, 0.0
    for a, e in spans:
        tokens += max(e - a, 0)
        total += _cycles(a - 1, e, realized, steps, {})
    return tokens, total


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("topk", [1, 8])
def test_replay_equals_the_served_process_recursed_span_by_span(temperature, topk, monkeypatch):
    """At the served top-1 (q one-hot) and, where drafts chain more often, over a top-8 proposal."""
    monkeypatch.setattr(ttt, "SAMPLE_TOPK", topk)
    d, head, used, examples = setup(seed=4, temperature=temperature, own_tokens=True)
    with torch.no_grad():
        d.lm_head.weight.mul_(0.05)  # q near uniform over its top-8: drafts accepted often enough to chain
    for e in examples[:2]:  # spans one token apart: a chain stops at its span's end, not in the next span
        n = torch.arange(len(e))
        e.loss_mask = (n % 5 != 0) & (n >= 2)
    _, counts = TTTObjective(d, head[used], K, 0.8, temperature, replay=True)(collate(examples))
    want = torch.zeros(K, 2, dtype=torch.float64)
    for e in examples:
        realized: dict = {}
        naive_counts(d, head, used, e, 0.8, temperature, realized)
        for k in range(K):
            want[k] += torch.tensor(expected_verify_steps(realized, e.loss_mask.tolist(), k + 1), dtype=torch.float64)
    torch.testing.assert_close(counts[:, [R_TOK, R_CYC]], want, rtol=1e-5, atol=1e-6)
    if topk > 1:  # a random drafter's top-1 is rarely the token that came out: its chains never grow
        assert (want[:, 1] < want[:, 0]).all() and (want[1:, 1] <= want[:-1, 1]).all()  # deeper: fewer steps
        assert want[2, 1] < want[1, 1] < want[0, 1]
    # Sampled validation without the replay, and training batches, count none.
    assert not TTTObjective(d, head[used], K, 0.8, temperature)(collate(examples))[1][:, R_TOK:].any()


@pytest.mark.parametrize("block", [1, 6, 32])
def test_replay_roots_solved_in_blocks_equals_the_position_loop_and_the_recursion(block):
    """Spans of every length (1 token, several blocks long, 1 token apart) at random rates, fresh each
    run: the blocked solve, the reference loop and the backward recursion agree."""
    steps, T = 5, 97
    rates = torch.rand(steps, 3, T, dtype=torch.float64)
    mask = torch.rand(3, T) < 0.85
    mask[0] = torch.arange(T) % 7 != 3  # 6-token spans one apart
    mask[1, :40], mask[1, 41], mask[1, 42] = False, False, True  # a 1-token span after a masked x_1
    for b in range(3):  # step k's token x_{t+k+2} past the span of x_{t+1}: no rate there
        end = T - 1  # the last token of the span holding x_{t+1}
        for t in range(T - 2, -1, -1):
            end = end if mask[b, t + 2:t + 3].all() else t + 1
            rates[:, b, t][torch.arange(steps) + t + 2 > end] = 0
    got, want = replay_roots(rates, mask, block), replay_roots_reference(rates, mask)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    oracle = torch.zeros(steps, 2, dtype=torch.float64)
    for b in range(3):
        realized = {(k, t): float(rates[k, b, t]) for k in range(steps) for t in range(T)}
        for k in range(steps):
            oracle[k] += torch.tensor(expected_verify_steps(realized, mask[b].tolist(), k + 1), dtype=torch.float64)
    torch.testing.assert_close(torch.stack(want, 1), oracle, rtol=1e-12, atol=0)
    assert (oracle[1:, 1] < oracle[:-1, 1]).all()


@pytest.mark.parametrize("topk", [1, 3, 6])
def test_realized_rate_is_the_chance_a_draft_was_accepted_given_the_token_that_came_out(topk, monkeypatch):
    """Lossless speculative sampling run many times with the engine's primitives: among the rounds
    that emitted x, the share whose draft was accepted is min(p, q)(x) / p(x), q the proposal over
    the drafter's top-k (one-hot at the served top-1)."""
    monkeypatch.setattr(ttt, "SAMPLE_TOPK", topk)
    g = torch.Generator().manual_seed(0)
    temperature, n = 0.8, 400_000
    logits, target = torch.randn(1, 6, generator=g) * 2, torch.randn(1, 6, generator=g) * 2
    idx, q_top, _ = proposal(logits, target, torch.logsumexp(target[0] / temperature, -1)[None], temperature)
    p, q = probs_from_logits(target, temperature)[0], torch.zeros(6).scatter(0, idx[0], q_top[0])
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    accepted = torch.rand(n, generator=g) < accept_probability(p.expand(n, 6), q.expand(n, 6), drafts)
    resampled = torch.multinomial(residual(p[None], q[None])[0], n, replacement=True, generator=g)
    out = torch.where(accepted, drafts, resampled)
    x = torch.arange(6)
    drafted = proposal(logits.expand(6, 6), target.expand(6, 6), torch.logsumexp(target[0] / temperature, -1).expand(6),
                       temperature)
    want = realized_accept_rate(*drafted, x, x)
    got = torch.stack([accepted[out == i].double().mean() for i in x])
    torch.testing.assert_close(got, want.double(), rtol=0, atol=0.01)
    torch.testing.assert_close(torch.bincount(out, minlength=6) / n, p, rtol=0, atol=0.005)  # lossless
    assert want.min() < 0.5 < want.max()


def test_padding_does_not_leak():
    d, head, used, examples = setup(seed=1)
    obj = TTTObjective(d, head[used], K, 0.8)
    _, together = obj(collate(examples))
    alone = sum(obj(collate([e]))[1] for e in examples)
    torch.testing.assert_close(together, alone, rtol=1e-9, atol=1e-9)


def test_summarize_is_ratios_of_sums():
    c = torch.zeros(3, N_COLS, dtype=torch.float64)
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
    assert not any(k.startswith("sampled") for k in m)
    c[:, S_DEN] = torch.tensor([10, 6, 5])
    c[:, S_NUM] = torch.tensor([6, 3, 4])
    m = summarize(c, sampled=True)
    assert (m["sampled_acc_0"], m["sampled_acc_1"], m["sampled_acc_2"]) == (0.6, 0.5, 0.8)
    assert math.isclose(m["sampled_accept_len"], 0.6 + 0.6 * 0.5 + 0.6 * 0.5 * 0.8)
    assert m["cond_acc_1"] == 0.8  # the greedy metrics are unchanged


def test_epoch_plan_is_deterministic_and_covers_every_sequence():
    lengths = [int(x) for x in torch.randint(3, 200, (103,), generator=torch.Generator().manual_seed(0))]
    a = plan_epoch(lengths, 8, 0, seed=3, epoch=1)
    assert a == plan_epoch(lengths, 8, 0, seed=3, epoch=1)
    assert a != plan_epoch(lengths, 8, 0, seed=3, epoch=2)
    assert sorted(i for b in a for i in b) == list(range(103))
    tok = plan_epoch(lengths, 8, 600, seed=3, epoch=0)
    assert sorted(i for b in tok for i in b) == list(range(103))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 600 for b in tok)


def test_teacher_logits_stay_exact_under_bf16_autocast(monkeypatch):
    """Training runs under bf16 autocast on CUDA (here CPU's, the same casts): the target's logits over the
    draft vocab must stay fp32, since the sampled acceptance sets them against logz taken in fp32."""
    d, head, used, examples = setup(seed=1, temperature=0.7)
    d = d.float()
    head = 8 * head.float()  # a peaked target: logits of tens, where bf16 keeps 2-3 digits
    ex = [Example(e.input_ids, e.loss_mask, e.aux_hidden.float(), e.final_hidden.float(),
                  *target_top1(e.final_hidden.float(), head, 0.7)) for e in examples]
    batch = collate(ex)
    seen = []
    real = ttt.proposal

    def spy(logits, target_logits, logz, temperature):
        seen.append(target_logits)
        return real(logits, target_logits, logz, temperature)

    monkeypatch.setattr(ttt, "proposal", spy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        TTTObjective(d, head[used], 2, 0.8, 0.7)(batch)
    exact = (batch.final_hidden @ head[used].T).flatten(0, 1)
    for rows in seen:  # each a selection of positions: every row is one of the exact ones
        assert rows.dtype == torch.float32 and torch.cdist(rows, exact, compute_mode="donot_use_mm_for_euclid_dist").min(1).values.max() < 1e-3
    assert seen
