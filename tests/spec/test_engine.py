"""Speculative decoding is lossless: greedy output with a drafter equals the target's own greedy output."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine

MODES = [
    pytest.param(dict(steps=4, topk=1), id="chain"),
    pytest.param(dict(steps=3, topk=3, draft_tokens=7), id="tree"),
]


def hf_greedy(target, prompt, n):
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("mode", MODES)
def test_random_drafter_lossless_batch1_matches_hf_generate(target, random_drafter, prompts, mode):
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=20, stop_at_eos=False, **mode))
    spec = engine.generate(prompts[:1])
    assert spec.tokens[0] == hf_greedy(target, prompts[0], 20)
    assert len(spec.accept_lengths) == spec.verify_passes


@pytest.mark.parametrize("mode", MODES)
def test_random_drafter_lossless_batch(target, random_drafter, prompts, mode):
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=24, stop_at_eos=False, **mode))
    base = engine.generate(prompts, speculative=False)
    spec = engine.generate(prompts)
    assert spec.tokens == base.tokens
    assert all(len(t) == 24 for t in spec.tokens)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 4])
def test_trained_drafter_accepts_and_rolls_back_losslessly(target, trained_drafter, prompts, mode, batch):
    engine = SpecEngine(target, trained_drafter, SpecConfig(max_new_tokens=40, stop_at_eos=False, **mode))
    spec_tokens, accept = [], []
    for i in range(0, 4, batch):
        g = engine.generate(prompts[i:i + batch])
        spec_tokens += g.tokens
        accept += g.accept_lengths
    base = engine.generate(prompts[:4], speculative=False).tokens
    assert spec_tokens == base
    top = engine.cfg.max_accept
    assert sum(accept) / len(accept) > 2.0  # several tokens per verify step
    assert any(a < top for a in accept)  # and rejections: rollback happened
    assert all(1 <= a <= top for a in accept)


def test_batch_rows_of_different_lengths_and_eos(target, trained_drafter, prompts):
    """A row that ends early (eos) stops committing while the others go on; outputs still match."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=4, max_new_tokens=30))
    base = engine.generate(prompts[:3], speculative=False)
    engine.eos = {base.tokens[1][6]}  # make row 1's 7th token an end of sequence
    base = engine.generate(prompts[:3], speculative=False)
    spec = engine.generate(prompts[:3])
    assert spec.tokens == base.tokens
    assert len(base.tokens[1]) <= 7 and base.tokens[1][-1] in engine.eos


def test_extend_matches_sequential_draft_steps(target, random_drafter):
    """The multi-position extend writes the same cache and returns the same step as draft_step calls."""
    d = random_drafter
    B, m, S = 3, 5, 16
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (B, m), generator=g)
    aux = torch.randn(B, m, 3 * target.hidden_size, generator=g)
    counts = torch.tensor([5, 2, 4])
    start = torch.tensor([0, 3, 1])

    runner = DrafterRunner(d, use_fused=False)
    runner.reset(B, S, "cpu")
    runner.k.normal_(generator=g)
    runner.v.normal_(generator=g)
    runner.lens = start.clone()
    k_ref, v_ref = runner.k.clone(), runner.v.clone()
    h, top, logp = runner.extend(ids, aux, counts, topk=4)

    for b in range(B):
        for j in range(int(counts[b])):
            pos = start[b:b + 1] + j
            hb, tb, lb = d.draft_step(d.embed(ids[b:b + 1, j]), aux[b:b + 1, j], pos, k_ref[b:b + 1], v_ref[b:b + 1],
                                      pos, 4)
        torch.testing.assert_close(h[b], hb[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(top[b], tb[0])
        torch.testing.assert_close(logp[b], lb[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.k, k_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.v, v_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(runner.lens, start + counts)


def test_tree_verifies_more_than_chain(target, trained_drafter, prompts):
    """A tree has at least the accept length of its own top-1 chain on the same prompts."""
    chain = SpecEngine(target, trained_drafter, SpecConfig(steps=3, topk=1, max_new_tokens=30, stop_at_eos=False))
    tree = SpecEngine(target, trained_drafter, SpecConfig(steps=3, topk=3, draft_tokens=9, max_new_tokens=30,
                                                            stop_at_eos=False))
    a = chain.generate(prompts[:4]).accept_lengths
    b = tree.generate(prompts[:4]).accept_lengths
    assert sum(b) / len(b) >= sum(a) / len(a) - 1e-9


def test_fused_step_selection(target, random_drafter, prompts):
    from drafter_lab.errors import LabError
    from drafter_lab.kernels import draft_step as fused_op

    # auto on CPU: the reference step; forced off: the reference step
    assert not SpecEngine(target, random_drafter, SpecConfig(use_fused=None)).fused
    assert not SpecEngine(target, random_drafter, SpecConfig(use_fused=False)).fused
    # forced on: the kernels' draft_step with the op forced (the CPU op when built), lossless;
    # an unbuilt op is a one-line error
    engine = SpecEngine(target, random_drafter, SpecConfig(use_fused=True, max_new_tokens=4))
    assert engine.fused
    if fused_op.available("cpu"):
        assert engine.generate(prompts[:1]).tokens == engine.generate(prompts[:1], speculative=False).tokens
    else:
        with pytest.raises(LabError, match="draft_step"):
            engine.generate(prompts[:1])
