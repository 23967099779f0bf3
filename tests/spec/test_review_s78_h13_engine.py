"""Mutation-audit pins for the speculative engine (session 78, helper 13)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine


def test_a_sampled_decode_draws_its_first_token_and_each_verify_steps_bonus(target, prompts):
    """At temperature 1 the prefill's token and a plain decode step's token are drawn, not the argmax: the
    first tokens differ by seed, and the second is not always the target's argmax after the first."""
    engine = SpecEngine(target, None, SpecConfig(max_new_tokens=2, temperature=1.0))
    outs = [engine.generate(prompts[:1], speculative=False, generator=torch.Generator().manual_seed(s)).tokens[0]
            for s in range(8)]
    assert len({o[0] for o in outs}) > 1
    argmax = [int(target.model(torch.tensor([prompts[0] + o[:1]])).logits[0, -1].argmax()) for o in outs]
    assert [o[1] for o in outs] != argmax


@pytest.mark.parametrize("mode", [dict(steps=3, topk=1), dict(steps=3, topk=3, draft_tokens=7)], ids=["chain", "tree"])
def test_each_cycles_draft_step_0_is_the_drafters_state_over_the_tokens_so_far(target, trained_drafter, prompts,
                                                                              mode):
    """After every verify the drafter's cache and step 0 are what a fresh prefill of the prompt and the tokens
    emitted so far gives: the prefill's next tokens end at the root, and each extend takes the target's hidden
    states and the next tokens along the accepted path (a wrong pairing still decodes losslessly, only worse)."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(max_new_tokens=12, stop_at_eos=False, **mode))
    cycles, extend = [], engine.drafter.extend

    def recording(nxt, aux, counts, topk):
        step0 = extend(nxt, aux, counts, topk)
        cycles.append((counts.tolist(), step0))
        return step0

    engine.drafter.extend = recording
    rows = prompts[:3]
    out = engine.generate(rows).tokens
    assert any(c > 1 for counts, _ in cycles[1:3] for c in counts)  # drafts were accepted: the path matters
    done = [-len(p) for p in rows]  # the first extend is the join's, over the prompts
    for counts, (h, top, logp) in cycles[:3]:  # every row is live in these
        done = [d + c for d, c in zip(done, counts)]
        seqs = [p + o[:d] for p, o, d in zip(rows, out, done)]  # the committed tokens; o[d] is the next root
        lens = torch.tensor([len(s) for s in seqs])
        ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
        nxt = torch.zeros_like(ids)
        for b, (s, o, d) in enumerate(zip(seqs, out, done)):
            ids[b, :len(s)] = torch.tensor(s)
            nxt[b, :len(s)] = torch.tensor(s[1:] + [o[d]])
        _, aux = engine.target.prefill(ids, lens)
        ref = DrafterRunner(trained_drafter, use_fused=False)
        ref.reset(len(seqs), 64, "cpu")
        h_ref, top_ref, logp_ref = ref.extend(nxt, aux, lens, top.shape[1])
        torch.testing.assert_close(h, h_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(logp, logp_ref, rtol=1e-4, atol=1e-4)
        assert torch.equal(top, top_ref)


def test_a_plain_decode_verifies_each_rows_root_alone(target, prompts):
    """Without speculation each pass is the root alone (one token a row), the baseline's cost; a tree with a
    second node still decodes the same tokens, so only the verified width shows it."""
    engine = SpecEngine(target, None, SpecConfig(max_new_tokens=5, stop_at_eos=False))
    widths, verify = [], engine.target.verify

    def recording(tokens, depth, ancestors, aux=True):
        widths.append(tokens.shape[1])
        return verify(tokens, depth, ancestors, aux=aux)

    engine.target.verify = recording
    assert engine.generate(prompts[:2], speculative=False).verify_passes == 4
    assert widths == [1] * 4
