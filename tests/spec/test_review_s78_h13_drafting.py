"""Mutation-audit pins for the drafter side (session 78, helper 13)."""

from __future__ import annotations

import torch

from drafter_lab.spec.drafting import DrafterRunner


def test_extend_attends_up_to_the_furthest_row_that_commits_every_position(target, random_drafter):
    """The extend's key window ends at the furthest query; when that row commits all m positions (a full
    accept on the longest row, a prefill's longest prompt), its last query needs that very slot."""
    d, (B, m, S) = random_drafter, (2, 3, 8)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, target.vocab_size, (B, m), generator=g)
    aux = torch.randn(B, m, 3 * target.hidden_size, generator=g)
    start, counts = torch.tensor([2, 0]), torch.tensor([m, 1])
    runner = DrafterRunner(d, use_fused=False)
    runner.reset(B, S, "cpu")
    runner.k.normal_(generator=g)
    runner.v.normal_(generator=g)
    runner.lens = start.clone()
    k_ref, v_ref = runner.k.clone(), runner.v.clone()
    h, top, logp = runner.extend(ids, aux, counts, topk=3)
    for b in range(B):
        for j in range(int(counts[b])):
            pos = start[b:b + 1] + j
            hb, tb, lb = d.draft_step(d.embed(ids[b:b + 1, j]), aux[b:b + 1, j], pos, k_ref[b:b + 1],
                                      v_ref[b:b + 1], pos, 3)
        torch.testing.assert_close(h[b], hb[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logp[b], lb[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(top[b], tb[0])
