"""Draft trees over long decodes: the accepted path's KV is compacted right in both models.

A wrong compaction is silent (accept lengths look fine) but sends the output off the target's greedy
one. Here an oracle hides the target's own continuation in each row's tree at random sibling ranks,
behind decoys with subtrees of their own, often cut short, with rows padded to different sizes: the
accepted path is then rarely a prefix of the node order, so the target cache moves entries at most
verify steps, over 120 tokens per row, in static and continuous batches. The drafter side is checked
by comparing its cache after tree cycles with one extend over each row's whole text.
"""

from __future__ import annotations

import random

import pytest
import torch

from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import padded_tree


class OracleTrees(NgramDrafter):
    """Drafts trees that hold each row's true greedy continuation (`full`: prompt + greedy output per
    prompt) among decoys; the n-gram plumbing only hands it each row's history."""

    def __init__(self, full: list[list[int]], vocab: int, seed: int):
        super().__init__(NgramConfig(1, 2))
        self.full, self.vocab, self.rng = full, vocab, random.Random(seed)

    def draft(self, root, histories, steps, topk, draft_tokens, pad_id):
        r, drafts = self.rng, []
        for h in histories:
            if h is None:  # a finished row drafts nothing
                drafts.append([])
                continue
            seq = next(f for f in self.full if f[:len(h)] == h)
            true = seq[len(h):len(h) + steps]
            cut = r.randint(0, len(true)) if r.random() < 0.5 else len(true)
            nodes, parent = [], 0
            for t in true[:cut]:
                for _ in range(r.randint(0, topk - 1)):  # decoys first, so the true child is not the first
                    decoy = r.randrange(self.vocab)
                    if decoy != t:
                        nodes.append((decoy, parent))
                        if r.random() < 0.5:
                            nodes.append((r.randrange(self.vocab), len(nodes)))
                nodes.append((t, parent))
                parent = len(nodes)
            for _ in range(r.randint(0, draft_tokens) - len(nodes)):  # rows of different sizes: padding
                nodes.append((r.randrange(self.vocab), r.randint(0, len(nodes))))
            drafts.append(nodes)
        return padded_tree(root, drafts, pad_id)


@pytest.mark.parametrize("slots", [None, 2])
def test_oracle_trees_decode_the_target_greedy_output_over_long_generations(target, prompts, slots, monkeypatch):
    n = 120
    cfg = dict(max_new_tokens=n, stop_at_eos=False)
    base = SpecEngine(target, None, SpecConfig(**cfg)).generate(prompts[:4], speculative=False).tokens
    moved = []
    commit = TargetRunner.commit

    def counting_commit(self, path, counts, verified):
        S = self.cache.get_seq_length() - verified
        col = torch.arange(path.shape[1])[None]
        moved.append(int(((col < counts[:, None]) & (self.lens[:, None] + col != S + path)).sum()))
        return commit(self, path, counts, verified)

    monkeypatch.setattr(TargetRunner, "commit", counting_commit)
    oracle = OracleTrees([p + o for p, o in zip(prompts, base)], target.vocab_size, seed=1)
    engine = SpecEngine(target, oracle, SpecConfig(steps=6, topk=3, draft_tokens=14, **cfg))
    spec = engine.generate(prompts[:4], slots=slots)
    assert spec.tokens == base
    assert sum(spec.accept_lengths) / len(spec.accept_lengths) > 3
    assert sum(spec.accept_lengths) == sum(len(t) - 1 for t in spec.tokens)
    assert sum(m > 0 for m in moved) > len(moved) // 2  # most verify steps compacted out of node order


def test_drafter_cache_after_tree_cycles_equals_one_extend_over_the_text(target, trained_drafter, prompts,
                                                                        monkeypatch):
    """Each cycle extends the drafter over the accepted path (root and drafts, each with the token
    after it): what it holds at the end equals extending once over prompt + output."""
    snap = {}
    keep = DrafterRunner.keep

    def snapshot_keep(self, rows):
        snap.setdefault("k", self.k.clone())
        snap.setdefault("v", self.v.clone())
        return keep(self, rows)

    monkeypatch.setattr(DrafterRunner, "keep", snapshot_keep)
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=4, topk=3, draft_tokens=9, max_new_tokens=40,
                                                            stop_at_eos=False, use_fused=False))
    gen = engine.generate(prompts[:4])
    assert sum(gen.accept_lengths) / len(gen.accept_lengths) > 2  # paths of several nodes were extended
    seqs = [p + o for p, o in zip(prompts, gen.tokens)]
    lens = torch.tensor([len(s) - 1 for s in seqs])  # the last token is the next root: not committed
    ids = torch.zeros(len(seqs), int(lens.max()) + 1, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
    _, aux = TargetRunner(target.model, trained_drafter.config.aux_layer_ids).prefill(ids[:, :-1], lens)
    fresh = DrafterRunner(trained_drafter, use_fused=False)
    fresh.reset(len(seqs), snap["k"].shape[2], ids.device)
    fresh.extend(ids[:, 1:], aux, lens, 1)
    for b, n in enumerate(lens.tolist()):
        torch.testing.assert_close(snap["k"][b, :, :n], fresh.k[b, :, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(snap["v"][b, :, :n], fresh.v[b, :, :n], rtol=1e-4, atol=1e-4)
