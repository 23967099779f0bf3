"""Mutation audit (review s73, h7) of the speculative engine: what a sampled chain's walk is handed when a
finished row rides along, and the draft bookkeeping of a plain (target-only) decode."""

from __future__ import annotations

import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine


def test_a_finished_row_riding_along_keeps_the_live_rows_proposals(target, random_drafter, prompts):
    """A sampled chain drawn from the top-4 (q not one-hot) accepts with min(1, p/q): once a finished row is
    cut to its root, the live rows' q must still reach the walk, else it accepts with p alone (not lossless)."""
    cfg = SpecConfig(steps=3, temperature=1.0, sample_topk=4, max_new_tokens=8, stop_at_eos=False)
    engine = SpecEngine(target, random_drafter, cfg)
    first = [t[0] for t in engine.generate(prompts[:2], generator=torch.Generator().manual_seed(0)).tokens]
    assert first[0] != first[1]
    engine.eos = {first[1]}  # the same draws again: row 1 ends at its first token and rides along
    seen = []
    walk = engine._walk

    def recording(tree, logits, generator):
        seen.append(tree.q is not None and tree.q.shape[:2] == tree.tokens.shape)
        return walk(tree, logits, generator)

    engine._walk = recording
    gen = engine.generate(prompts[:2], generator=torch.Generator().manual_seed(0))
    assert gen.tokens[1] == [first[1]] and gen.rows_per_pass[0] == 2
    assert seen and all(seen)


def test_a_plain_decode_records_no_drafts(target, random_drafter, prompts):
    """Target-only passes draft nothing: no draft lengths, and none of them counts as a no-draft pass of
    speculation (eval's n-gram draft cost divides by the speculative passes that drafted)."""
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=2, max_new_tokens=5, stop_at_eos=False))
    base = engine.generate(prompts[:2], speculative=False)
    assert base.verify_passes == 4 and len(base.accept_lengths) == 8
    assert base.draft_lengths == [] and base.no_draft_passes == 0
    spec = engine.generate(prompts[:2])
    assert spec.draft_lengths and set(spec.draft_lengths) == {2} and spec.no_draft_passes == 0
