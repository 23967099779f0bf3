"""Review s70 (h4) of the speculative engine: the drafter cache is as long as the worst case needs and no
longer, and a finished row riding along in a static batch runs no n-gram lookup."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig


def _spy_extend(engine) -> list[int]:
    """Record how far into the drafter cache each extend reaches (its last slot + 1)."""
    reach, extend = [], engine.drafter.extend

    def spy(next_ids, aux, counts, topk):
        reach.append(int(engine.drafter.lens.max()) + next_ids.shape[1])
        return extend(next_ids, aux, counts, topk)

    engine.drafter.extend = spy
    return reach


@pytest.mark.parametrize("use_fused", [False, True], ids=["reference", "fused"])
def test_a_finished_row_riding_along_fills_the_drafter_cache_to_its_last_slot(
        target, trained_drafter, prompts, use_fused, require_draft_step_op):
    """The longest prompt (one the drafter knows: full chains of 8 accepted) ends at max_new_tokens, its
    last step cut, while a prompt of noise (about a token per step) still decodes: its 8-deep chain's
    extend spans 9 slots past the finished row's len(prompt) + max_new_tokens - 1 committed ones. That is
    the cache's last slot (2 * (steps + 1) over the prompt and max_new_tokens left 10 unused; one fewer
    fails), and the output is the plain decode's."""
    if use_fused:
        require_draft_step_op("cpu")
    steps, new = 8, 16
    noise = torch.randint(3, target.vocab_size, (5,), generator=torch.Generator().manual_seed(0)).tolist()
    batch = [prompts[1], noise]
    assert len(prompts[1]) == max(map(len, prompts + [noise]))
    cfg = SpecConfig(steps=steps, max_new_tokens=new, stop_at_eos=False, use_fused=use_fused)
    engine = SpecEngine(target, trained_drafter, cfg)
    reach = _spy_extend(engine)
    g = engine.generate(batch)
    assert g.tokens == engine.generate(batch, speculative=False).tokens
    assert steps + 1 in g.accept_lengths
    assert max(reach) == engine.drafter.k.shape[2] == len(prompts[1]) + new + steps


def test_rows_joining_a_continuous_batch_decode_losslessly_in_the_drafter_cache(target, trained_drafter, prompts):
    """A finished row leaves before the next cycle, so the rows that join stay within the same cache length."""
    cfg = SpecConfig(steps=8, max_new_tokens=16, stop_at_eos=False)
    engine = SpecEngine(target, trained_drafter, cfg)
    batch = [prompts[1], prompts[4], prompts[2]]
    assert engine.generate(batch, slots=2).tokens == engine.generate(batch, speculative=False).tokens


@pytest.mark.parametrize("topk", [1, 2], ids=["chain", "tree"])
def test_a_finished_row_runs_no_ngram_lookup(target, prompts, topk):
    """Each cycle a row that has ended (here at max_new_tokens, rows at different cycles) rode along and
    looked up its continuations, whose nodes `_finished_as_roots` then dropped: one lookup per (row,
    verify step) while the row is unfinished, and the output is the plain decode's."""
    drafter = NgramDrafter(NgramConfig(1, 3))
    lookups, continuations = [], drafter.continuations

    def spy(index, tokens, steps, k):
        lookups.append(len(tokens))
        return continuations(index, tokens, steps, k)

    drafter.continuations = spy
    cfg = SpecConfig(steps=3, topk=topk, max_new_tokens=12, stop_at_eos=False)
    engine = SpecEngine(target, drafter, cfg)
    g = engine.generate(prompts[:3])
    assert g.tokens == engine.generate(prompts[:3], speculative=False).tokens
    assert len(g.accept_lengths) < 3 * g.verify_passes  # some row rode along finished
    assert len(lookups) == len(g.accept_lengths)
