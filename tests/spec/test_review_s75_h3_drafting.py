"""Drafter-side pins from mutation testing (session 75, h3): `extend` reads only what is committed, and
the automatic step choice takes the fused op for a drafter on CUDA only."""

from __future__ import annotations

import torch

from drafter_lab.kernels import draft_step as fused_op
from drafter_lab.spec.drafting import DrafterRunner, resolve_step


def test_extend_ignores_stale_overflowed_entries_past_each_rows_commit(random_drafter, target):
    """A chain's draft steps write their speculative entries into the drafter cache, past `lens`; when one
    overflowed (an fp16 drafter), they are NaN, and a short accept leaves them past the new commit. The
    next extend's queries mask those slots, but a masked probability 0 times a NaN value is NaN: every
    later cycle of the row drafted from NaN. The stale values must not matter, as in `draft_step`."""
    d, (B, m, topk) = random_drafter, (3, 4, 3)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, target.vocab_size, (B, m), generator=g)
    aux = torch.randn(B, m, 3 * d.config.target_hidden_size, generator=g)
    committed = torch.randn(2, B, d.config.num_key_value_heads, 16, d.config.head_dim, generator=g)
    lens, counts = torch.tensor([3, 0, 5]), torch.tensor([1, 2, m])
    outs = []
    for stale in (0.0, float("nan")):
        runner = DrafterRunner(d, use_fused=False)
        runner.reset(B, 16, "cpu")
        runner.k.copy_(committed[0]), runner.v.copy_(committed[1])
        for b in range(B):  # what the last cycle's draft steps left past this cycle's commit
            runner.k[b, :, lens[b] + counts[b]:] = stale
            runner.v[b, :, lens[b] + counts[b]:] = stale
        runner.lens = lens.clone()
        outs.append(runner.extend(ids, aux, counts, topk))
    (h0, top0, lp0), (h1, top1, lp1) = outs
    assert not h1.isnan().any()
    torch.testing.assert_close(h1, h0), torch.testing.assert_close(lp1, lp0)
    assert torch.equal(top1, top0)


def test_auto_takes_the_reference_step_for_a_drafter_off_cuda(random_drafter, monkeypatch):
    """The op built with a CPU kernel, for a drafter it implements: `use_fused=None` still runs the reference
    on the CPU (the fused op is for CUDA), while forcing it takes the op."""
    monkeypatch.setattr(fused_op, "available", lambda device=None: True)
    monkeypatch.setattr(fused_op, "op_takes", lambda cfg: True)
    assert resolve_step(random_drafter, None) == (random_drafter.draft_step, False)
    assert resolve_step(random_drafter, True)[1]


def test_a_chain_of_s_tokens_runs_s_minus_1_draft_steps(random_drafter, target):
    """Step 0 comes from the extend; each further token takes one draft step, and the last token drafted
    needs none after it (one more was a whole drafter step per cycle, its output thrown away)."""
    d, B, steps = random_drafter, 2, 4
    g = torch.Generator().manual_seed(6)
    runner = DrafterRunner(d, use_fused=False)
    runner.reset(B, 16, "cpu")
    runner.lens = torch.tensor([3, 5])
    step, calls = runner.step, []
    runner.step = lambda *args: calls.append(1) or step(*args)
    h0 = torch.randn(B, d.config.hidden_size, generator=g)
    ids0 = torch.randint(0, target.vocab_size, (B, 1), generator=g)
    tree = runner.draft_chain(ids0[:, 0], h0, ids0, torch.zeros(B, 1), steps)
    assert tree.size == steps + 1 and len(calls) == steps - 1
