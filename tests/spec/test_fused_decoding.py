"""Speculative decoding through the fused draft-step op, end to end: the engine's own KV cache,
prefill, chain and tree beams go to the op, which must draft what the reference drafts, losslessly.
The CPU op runs in CI; the CUDA kernels run with `-m gpu` (the drafter's shapes fit them)."""

from __future__ import annotations

import copy

import pytest
import torch

from drafter_lab.kernels import draft_step as fused_op
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.eval import render_prompts
from drafter_lab.targets.hf import load_target

from .conftest import greedy_continuations, make_drafter, one_thread, train_on


@pytest.fixture(scope="module")
def setup(wide_llama, conversations):
    """The target's prompts and a drafter trained on its greedy continuations (it accepts several
    tokens per step and also gets rejected, so rollback runs through the op's cache)."""
    target = load_target(wide_llama)
    prompts = render_prompts(target.tokenizer, conversations)
    with one_thread():
        seqs = greedy_continuations(target, prompts)
        drafter = train_on(target, make_drafter(target, seed=5), seqs, iters=40)
    c = drafter.config  # shapes the CUDA kernels take (forcing the op on others is an error)
    cache = torch.zeros(1, c.num_key_value_heads, 8, c.head_dim)
    step = (torch.zeros(1, c.hidden_size), torch.zeros(1, 3 * c.target_hidden_size), cache, cache)
    assert fused_op.cuda_supports(drafter, *step, topk=4)
    return prompts, drafter


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("topk,draft_tokens,slots", [(1, None, None), (3, 8, None), (3, 8, 2)],
                         ids=["chain", "tree", "tree-continuous"])
def test_fused_step_drafts_like_the_reference(setup, wide_llama, device, topk, draft_tokens, slots,
                                              require_draft_step_op):
    require_draft_step_op(device)
    prompts, trained = setup
    target = load_target(wide_llama, device=device)
    drafter = copy.deepcopy(trained).to(device)
    runs = {}
    with one_thread():
        for fused in (False, True):
            cfg = SpecConfig(steps=4, topk=topk, draft_tokens=draft_tokens, use_fused=fused, max_new_tokens=32)
            engine = SpecEngine(target, drafter, cfg)
            assert engine.fused == fused
            runs[fused] = engine.generate(prompts, slots=slots)
        plain = engine.generate(prompts, speculative=False)
    ref, op = runs[False], runs[True]
    assert op.tokens == ref.tokens == plain.tokens  # lossless either way
    assert sum(ref.accept_lengths) / len(ref.accept_lengths) > 1.5  # drafts that matter
    # Same drafts, so the same accepted lengths; a near-tie may flip a top-1 here and there in fp32.
    assert abs(len(op.accept_lengths) - len(ref.accept_lengths)) <= 1
    same = sum(a == b for a, b in zip(op.accept_lengths, ref.accept_lengths))
    assert same >= 0.95 * len(ref.accept_lengths)
