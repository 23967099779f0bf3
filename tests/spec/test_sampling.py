"""Rejection sampling is lossless: exactly for the primitives, empirically through walk and engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from drafter_lab.spec.accept import sampled_walk
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.sampling import accept_probability, one_hot, residual
from drafter_lab.spec.tree import DraftTree

from .conftest import make_drafter


def rand_dist(g, v, peaked=1.0):
    return torch.softmax(peaked * torch.randn(v, generator=g).double(), -1)


def test_speculative_sampling_output_is_exactly_p():
    """P(y) = sum_x q(x) [a(x) 1{y=x} + (1 - a(x)) r(y)] must equal p(y), a = min(1, p/q), r = norm(max(p-q, 0))."""
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        V = 9
        p, q = rand_dist(g, V, 3.0), rand_dist(g, V, 3.0)
        if trial % 5 == 0:
            q[int(torch.randint(V, (1,), generator=g))] = 0.0  # proposals that never draft some tokens
            q = q / q.sum()
        xs = torch.nonzero(q > 0)[:, 0]
        P = p[None].expand(len(xs), V)
        Q = q[None].expand(len(xs), V)
        a = accept_probability(P, Q, xs)
        r = residual(P, Q)
        out = (q[xs, None] * ((1 - a)[:, None] * r + a[:, None] * one_hot(xs, V).double())).sum(0)
        torch.testing.assert_close(out, p, rtol=0, atol=1e-12)


def test_recursive_rejection_with_deterministic_candidates_is_exactly_p():
    """Trying fixed candidates x1, x2, x3 in turn (q = one-hot) on the shrinking residual gives p."""
    g = torch.Generator().manual_seed(1)
    V = 8
    for _ in range(10):
        p = rand_dist(g, V, 2.0)[None]
        cands = torch.randperm(V, generator=g)[:3]
        out = torch.zeros(V, dtype=torch.double)
        reach, r = 1.0, p
        for x in cands:
            x = x[None]
            q = one_hot(x, V).double()
            a = accept_probability(r, q, x)[0]
            out[x] += reach * a
            reach, r = reach * (1 - a), residual(r, q)
        out += reach * r[0]
        torch.testing.assert_close(out, p[0], rtol=0, atol=1e-12)


def test_residual_of_equal_distributions_is_p():
    p = torch.softmax(torch.randn(2, 5), -1)
    torch.testing.assert_close(residual(p, p.clone()), p)


def _tv(samples: torch.Tensor, p: torch.Tensor) -> float:
    emp = torch.bincount(samples, minlength=p.numel()).double() / samples.numel()
    return 0.5 * float((emp - p.double()).abs().sum())


@pytest.mark.parametrize("kind", ["tree", "sampled-chain"])
def test_walk_emits_target_distribution(kind):
    """Synthetic verify: node distributions given, the walk's first and second tokens follow them."""
    g = torch.Generator().manual_seed(2)
    R, V = 40000, 6
    if kind == "tree":  # root with two children; the first child has a child of its own
        parents, depth = [-1, 0, 0, 1], [0, 1, 1, 2]
        q = None
    else:  # root -> x1 -> x2, the xs drawn from proposals q
        parents, depth = [-1, 0, 1], [0, 1, 2]
        q = torch.stack([torch.zeros(V), rand_dist(g, V, 2.0).float(), rand_dist(g, V, 2.0).float()])
    N = len(parents)
    probs = torch.stack([rand_dist(g, V, 2.0).float() for _ in range(N)])
    # drafted like a drafter would: the likeliest tokens (children of a node are distinct)
    tokens = [5, *probs[0].topk(2).indices.tolist(), int(probs[1].argmax())] if kind == "tree" else [5, 0, 0]
    tree = DraftTree(
        tokens=torch.tensor(tokens).expand(R, N).clone(),
        parents=torch.tensor(parents).expand(R, N).clone(),
        depth=torch.tensor(depth).expand(R, N).clone(),
        q=None if q is None else q.expand(R, N, V).clone(),
    )
    if q is not None:  # draft tokens must be samples of q: draw each row's chain
        first = torch.multinomial(q[1], R, replacement=True, generator=g)
        second = torch.multinomial(q[2], R, replacement=True, generator=g)
        tree.tokens[:, 1], tree.tokens[:, 2] = first, second
    path, counts, bonus = sampled_walk(tree, probs.expand(R, N, V), g)
    toks = tree.tokens.gather(1, path.clamp_min(0))
    emitted = torch.cat([toks[:, 1:], torch.zeros(R, 1, dtype=torch.long)], 1)
    emitted[torch.arange(R), counts - 1] = bonus
    assert _tv(emitted[:, 0], probs[0]) < 0.015
    # given the first token y (accepted as a child, so the walk continues there), the second
    # token follows that child's distribution
    for node in range(1, N):
        if parents[node] != 0:
            continue
        rows = (counts >= 2) & (path[:, 1] == node)
        assert rows.sum() > 1000
        assert _tv(emitted[rows, 1], probs[node]) < 0.03
    assert set(counts.tolist()) >= {1, 2}


def _tiny_target(tmp_path: Path, vocab=12, seed=0):
    """A random 4-layer Llama over a 12-token vocabulary with a peaked head (no tokenizer needed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from drafter_lab.targets.hf import Target

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)  # random init is nearly uniform: make p worth testing
    model.requires_grad_(False)
    return Target(path=tmp_path, model=model, tokenizer=None, fingerprint="tiny")


def _exact_next(target, prefixes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(target.model(prefixes).logits[:, -1].double(), -1)


@pytest.mark.parametrize("kind, mode, slots", [
    ("eagle", dict(steps=2, topk=1), None), ("eagle", dict(steps=2, topk=3, draft_tokens=4), None),
    ("ngram", dict(steps=2, topk=1), None), ("ngram", dict(steps=2, topk=2, draft_tokens=3), None),
    ("eagle", dict(steps=2, topk=1), 1000),
], ids=["chain", "tree", "ngram", "ngram-tree", "chain-continuous"])
def test_engine_sampling_matches_target_distribution(tmp_path, kind, mode, slots):
    target = _tiny_target(tmp_path)
    if kind == "ngram":  # deterministic proposals from the row's own tokens, in padded chains
        drafter = NgramDrafter(NgramConfig(1, 2))
    else:
        drafter = make_drafter(target, seed=5)
        with torch.no_grad():
            drafter.lm_head.weight.mul_(40.0)
    V = target.vocab_size
    prompt = [3, 7, 1, 4]
    R = 6000
    # a fourth token, so that drafts accepted in the verify that reaches the third are not cut (nor uncounted)
    engine = SpecEngine(target, drafter, SpecConfig(temperature=1.0, max_new_tokens=4, stop_at_eos=False, **mode))
    gen = engine.generate([prompt] * R, generator=torch.Generator().manual_seed(0), slots=slots)
    out = torch.tensor(gen.tokens)[:, :3]  # [R, 3]
    assert 1 in gen.accept_lengths and max(gen.accept_lengths) >= 2

    p1 = _exact_next(target, torch.tensor([prompt]))[0]
    pre2 = torch.tensor([prompt + [a] for a in range(V)])
    p2 = _exact_next(target, pre2)  # [V, V]: p(y2 | y1)
    pre3 = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
    p3 = _exact_next(target, pre3).view(V, V, V)  # p(y3 | y1, y2)
    joint12 = p1[:, None] * p2
    m2 = joint12.sum(0)
    m3 = (joint12[:, :, None] * p3).sum((0, 1))
    assert _tv(out[:, 0], p1) < 0.04
    assert _tv(out[:, 1], m2) < 0.04
    assert _tv(out[:, 2], m3) < 0.04
    assert _tv(out[:, 0] * V + out[:, 1], joint12.flatten()) < 0.08
