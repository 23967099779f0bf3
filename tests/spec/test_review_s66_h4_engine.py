"""Mutation audit (review s66, h4) of the speculative engine: settings it refuses, the tree's draft budget,
the longest accept length, eos handling, and per-row state as rows join a continuous batch."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec import engine as engine_module
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig

from .conftest import late_tokens, make_drafter


@pytest.mark.parametrize("field", ["steps", "topk", "sample_topk", "max_new_tokens"])
def test_a_count_below_one_is_refused_by_name(field):
    """sample_topk 0 met torch.multinomial (or torch.topk) as a traceback at the first sampled draft."""
    with pytest.raises(LabError, match=f"^{field} must be >= 1, got 0$"):
        SpecConfig(**{field: 0})


def test_a_trees_draft_budget_is_capped_at_its_candidates():
    """steps 3, topk 2: 2 children at depth 1, then 2 x 2 candidates under the 2 expanded nodes at each
    later depth (SGLang's topk + (steps - 1) x topk^2): 10, not steps x topk^2 = 12."""
    assert SpecConfig(steps=3, topk=2, draft_tokens=10).tree_tokens == 10
    with pytest.raises(LabError, match=r"^draft_tokens must be in 1\.\.10 for steps=3, topk=2, got 11$"):
        SpecConfig(steps=3, topk=2, draft_tokens=11)


@pytest.mark.parametrize("kw, longest", [(dict(steps=4), 5), (dict(steps=4, topk=2, draft_tokens=2), 3),
                                         (dict(steps=2, topk=3, draft_tokens=6), 3)])
def test_the_longest_accept_length_is_the_deepest_path_plus_the_bonus(kw, longest):
    """A tree of 2 draft tokens is at most 2 deep, however many steps drafted it: its accept histogram
    ends at 3."""
    assert SpecConfig(**kw).max_accept == longest


def test_a_topk_as_wide_as_the_draft_vocab_is_taken(target):
    SpecEngine(target, make_drafter(target, torch.arange(4)), SpecConfig(steps=2, topk=4, max_new_tokens=4))


@pytest.mark.parametrize("kw, name", [(dict(topk=5, steps=2), "topk"), (dict(temperature=1.0, sample_topk=5),
                                                                          "sample_topk")])
def test_the_refusal_names_the_setting_that_is_too_wide(target, kw, name):
    """A sampled chain's step 0 is sample_topk wide, a tree's topk: the message names the one to lower."""
    with pytest.raises(LabError, match=f"^{name} 5 exceeds the drafter's draft vocab of 4 tokens$"):
        SpecEngine(target, make_drafter(target, torch.arange(4)), SpecConfig(max_new_tokens=4, **kw))


def test_an_empty_prompt_no_slot_or_no_drafter_is_refused(target, random_drafter, prompts):
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=4))
    with pytest.raises(LabError, match="^an empty prompt cannot be decoded$"):
        engine.generate([prompts[0], []])
    # slots=0 read as "no slots given" and decoded every prompt at once
    with pytest.raises(LabError, match="^slots must be >= 1, got 0$"):
        engine.generate(prompts[:2], slots=0)
    with pytest.raises(LabError, match="^speculative decoding needs a drafter$"):
        SpecEngine(target, None, SpecConfig(max_new_tokens=4)).generate(prompts[:1])


def test_stop_at_eos_false_decodes_past_the_targets_eos(target, prompts, monkeypatch):
    """The target's own eos (here its third greedy token) ends the row unless stop_at_eos is False."""
    plain = SpecEngine(target, None, SpecConfig(max_new_tokens=8, stop_at_eos=False))
    base = plain.generate(prompts[:1], speculative=False).tokens[0]
    eos = base[2]
    assert eos not in base[:2]
    monkeypatch.setattr(engine_module, "stop_token_ids", lambda t: [eos])
    cfg = SpecConfig(steps=3, max_new_tokens=8)
    drafter = NgramDrafter(NgramConfig(1, 3))
    assert SpecEngine(target, drafter, cfg).generate(prompts[:1]).tokens[0] == base[:3]
    no_stop = SpecConfig(steps=3, max_new_tokens=8, stop_at_eos=False)
    assert SpecEngine(target, drafter, no_stop).generate(prompts[:1]).tokens[0] == base


def _per_prompt_accepts(engine, prompts, slots):
    """Each prompt's accept lengths in order (its streamed pieces after the prefill's token)."""
    pieces = [[] for _ in prompts]
    engine.generate(prompts, slots=slots, on_tokens=lambda i, tokens: pieces[i].append(len(tokens)))
    return [p[1:] for p in pieces]


def test_a_prompt_drafts_alike_alone_and_in_a_continuous_batch(target, trained_drafter, prompts):
    """The drafter's step 0 of each row stays its own as rows leave (at eos, at different cycles) and
    join: the accept lengths of each prompt are those it gets decoded alone (a row given another
    row's step 0 drafts that row's continuation)."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=3, max_new_tokens=24))
    engine.eos = late_tokens(engine.generate(prompts, speculative=False).tokens, first=3)
    alone = [_per_prompt_accepts(engine, [p], None)[0] for p in prompts]
    assert _per_prompt_accepts(engine, prompts, 2) == alone
    assert len({len(a) for a in alone}) > 2  # rows end at different cycles
    assert len({tuple(a) for a in alone}) > 1  # and draft differently: a swap would show


def test_an_eagle_tree_verifies_its_draft_tokens_every_cycle(target, trained_drafter, prompts):
    """steps 3 x topk 3 make 21 candidates: each cycle verifies the best draft_tokens = 5 of them."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=3, topk=3, draft_tokens=5, max_new_tokens=16))
    g = engine.generate(prompts[:3])
    assert set(g.draft_lengths) == {5} and len(g.draft_lengths) == len(g.accept_lengths)


def test_a_finished_row_is_looked_up_with_its_prompt(target, prompts):
    """Across prompts, a row that leaves hands the n-gram drafter its prompt and its output."""
    drafter = NgramDrafter(NgramConfig(1, 3, across_prompts=True))
    engine = SpecEngine(target, drafter, SpecConfig(steps=3, max_new_tokens=6, stop_at_eos=False))
    out = engine.generate(prompts[:2], slots=1).tokens
    assert drafter.earlier.tokens == prompts[0] + out[0] + prompts[1] + out[1]
    assert drafter.earlier.row_ends == [len(prompts[0] + out[0]), len(drafter.earlier.tokens)]


@pytest.mark.parametrize("mode", [dict(steps=3, sample_topk=4), dict(steps=3, topk=2, draft_tokens=4)],
                         ids=["sampled-chain", "tree"])
def test_a_seeded_generator_alone_decides_what_is_sampled(target, random_drafter, prompts, mode):
    """The first token, the draws of the drafts and the accept/resample test all use the caller's
    generator: the same seed drafts and decodes the same tokens whatever torch's global seed (an
    untrained drafter: its top-4 are near even, so a draw from another generator drafts others)."""
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=12, temperature=1.0, **mode))
    drafts = []
    draft = engine._draft

    def recording(*args):
        tree = draft(*args)
        drafts.append(tree.tokens.tolist())
        return tree

    engine._draft = recording
    runs = []
    for global_seed in (1, 2):
        drafts.clear()
        torch.manual_seed(global_seed)
        g = engine.generate(prompts[:3], generator=torch.Generator().manual_seed(7))
        runs.append((g.tokens, g.accept_lengths, list(drafts)))
    assert runs[0] == runs[1]
    other = engine.generate(prompts[:3], generator=torch.Generator().manual_seed(8))
    assert other.tokens != runs[0][0]  # the seed matters: the sampling is no argmax


def test_an_ngram_row_drafts_from_its_own_tokens_in_a_continuous_batch(target, prompts):
    """Rows leaving and joining keep each row's n-gram index with its row, and a new decode starts with
    no rows: each prompt's accept lengths are those it gets decoded alone, by the same engine."""
    engine = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), SpecConfig(steps=4, max_new_tokens=24,
                                                                            stop_at_eos=False))
    alone = [_per_prompt_accepts(engine, [p], None)[0] for p in prompts]
    assert _per_prompt_accepts(engine, prompts, 2) == alone
    assert max(max(a) for a in alone) > 1 and len({tuple(a) for a in alone}) > 1


@pytest.mark.parametrize("speculative", [False, True])
def test_no_prompts_decode_to_nothing(target, random_drafter, speculative):
    """An empty list of prompts was a ValueError (max() of the prompt lengths) out of the engine."""
    g = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=4)).generate([], speculative=speculative)
    assert (g.tokens, g.accept_lengths, g.verify_passes, g.first_token_seconds) == ([], [], 0, [])


def test_a_decode_interrupted_midway_leaves_no_ngram_rows_behind(target, prompts):
    """A callback that raises (a progress bar's ^C) leaves rows in flight: the next decode starts from none,
    so each of its prompts drafts from its own tokens as on a fresh engine."""
    cfg = SpecConfig(steps=4, max_new_tokens=24, stop_at_eos=False)
    engine = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), cfg)

    def interrupt(i, tokens):
        if len(tokens) > 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.generate(prompts[2:], on_tokens=interrupt)
    fresh = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), cfg)
    assert _per_prompt_accepts(engine, prompts[:2], None) == _per_prompt_accepts(fresh, prompts[:2], None)
