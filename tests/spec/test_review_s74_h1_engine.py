"""Mutation audit (review s74, h1) of the speculative engine: the tree a finished row is verified with,
the draft budget's bounds, and what the main loop hands its callbacks."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec import phases
from drafter_lab.spec.engine import SpecConfig, SpecEngine, _finished_as_roots
from drafter_lab.spec.tree import chain, padded_tree

from .conftest import make_drafter


def test_a_finished_row_keeps_its_root_alone_and_all_padding_columns_go():
    """Row 0 has ended and drafted the widest tree: its drafts become padding at depth 0, and the columns
    that are then padding in every row are dropped (the live rows' drafts and every root stay)."""
    tree = padded_tree(torch.tensor([5, 6, 7]), [[(10, 0), (11, 1), (12, 0)], [(20, 0)], []], pad_id=0)
    cut = _finished_as_roots(tree, torch.tensor([False, True, True]))
    assert cut.tokens.tolist() == [[5, 10], [6, 20], [7, 0]]
    assert cut.parents.tolist() == [[-1, 1], [-1, 0], [-1, 1]]
    assert cut.depth.tolist() == [[0, 0], [0, 1], [0, 0]]
    assert cut.q is None


def test_a_finished_row_in_a_sampled_chain_keeps_the_proposals_of_the_live_rows():
    """A sampled chain's q rides along, cut to the columns kept (here all: the live row drafted 3)."""
    q = torch.rand(2, 4, 6)
    tree = chain(torch.tensor([1, 2]), torch.tensor([[3, 4, 5], [3, 4, 5]]), q)
    cut = _finished_as_roots(tree, torch.tensor([True, False]))
    assert cut.parents.tolist() == [[-1, 0, 1, 2], [-1, 1, 2, 3]]
    assert cut.depth.tolist() == [[0, 1, 2, 3], [0, 0, 0, 0]]
    assert cut.q is not None and torch.equal(cut.q, q)


def test_a_trees_draft_budget_defaults_to_steps_times_topk_and_may_be_one_token():
    assert SpecConfig(steps=3, topk=2).tree_tokens == 6
    one = SpecConfig(steps=3, topk=2, draft_tokens=1)
    assert (one.tree_tokens, one.max_accept) == (1, 2)


def test_a_greedy_chain_ignores_sample_topk(target):
    """Only a sampled chain drafts from the top-sample_topk: a greedy one wider than the draft vocab is taken."""
    cfg = SpecConfig(steps=2, sample_topk=5, max_new_tokens=4)
    assert not cfg.sampled_chain
    assert SpecEngine(target, make_drafter(target, torch.arange(4)), cfg)._step0_topk() == 1


def test_a_streaming_consumers_time_is_charged_where_its_tokens_came_out(target, random_drafter, prompts,
                                                                        monkeypatch):
    """On a clock that only the consumer moves (100 s a call): the first tokens' streaming is the prefill's,
    each cycle's is its accept phase's (host bookkeeping), none of it the next cycle's draft."""
    now = [0.0]
    monkeypatch.setattr(phases.time, "perf_counter", lambda: now[0])
    calls = []

    def slow(i, tokens):
        calls.append(i)
        now[0] += 100.0

    engine = SpecEngine(target, random_drafter, SpecConfig(steps=2, max_new_tokens=6, stop_at_eos=False))
    g = engine.generate(prompts[:2], on_tokens=slow)
    assert len(calls) > 2 + g.verify_passes  # both rows streamed in some cycle
    assert g.phase_seconds == {"prefill": 200.0, "draft": 0.0, "verify": 0.0, "accept": 100.0 * (len(calls) - 2),
                               "extend": 0.0}


def test_no_prompts_take_no_position(target, random_drafter):
    """The bound is the longest prompt's: with none, the deepest position is 0 + 4 + 4 - 2 = 6; one token
    of prompt takes it to 7."""
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=4, max_new_tokens=4))
    engine.max_positions = 7
    engine.check_positions([])
    with pytest.raises(LabError, match="takes the longest prompt \\(1 tokens\\) to position 7"):
        engine.check_positions([[1]])
