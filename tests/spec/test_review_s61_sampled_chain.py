"""A chain served at a temperature drafts the drafter's top-1 and the target accepts it with p(x), as
SGLang (target-only tree sampling) and vLLM (rejection sampling without draft probabilities) serve
EAGLE: the chain drew from the drafter's top-8 at T and accepted with min(1, p/q), which accepts more
(every draft, for a drafter whose q equals p), so `eval` and the sampled validation described a
sampler neither engine runs by default."""

from __future__ import annotations

import torch

from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.train.ttt import proposal


def test_the_engine_drafts_the_top1_at_a_temperature(target, trained_drafter, prompts, monkeypatch):
    chains = []
    real = DrafterRunner.draft_chain

    def spy(self, root, h0, ids0, logp0, *args, **kwargs):
        tree = real(self, root, h0, ids0, logp0, *args, **kwargs)
        chains.append((ids0.shape[1], tree))
        return tree

    monkeypatch.setattr(DrafterRunner, "draft_chain", spy)
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=3, temperature=0.9, max_new_tokens=12,
                                                            use_fused=False))
    engine.generate(prompts[:2], generator=torch.Generator().manual_seed(0))
    assert chains and all(k == 1 for k, _ in chains)
    for _, tree in chains:  # each draft's proposal is one-hot: accepted with p(x), rejected x never resampled
        q = tree.q[:, 1:]
        assert torch.equal(q.amax(-1), torch.ones_like(q.amax(-1)))


def test_the_sampled_validation_proposes_the_top1():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(5, 11, generator=g), torch.randn(5, 11, generator=g)
    logz = torch.logsumexp(target / 0.7, -1)
    idx, q, p = proposal(logits, target, logz, 0.7)
    assert torch.equal(idx[:, 0], logits.argmax(-1)) and idx.shape == (5, 1) and torch.equal(q, torch.ones(5, 1))
    torch.testing.assert_close(p[:, 0], torch.softmax(target / 0.7, -1).gather(1, idx)[:, 0])
