"""Lossless speculative decoding on the lab's own target pair (the `micro` preset, built in seconds).

The micro targets learn little and loop, so a briefly trained drafter accepts nearly everything;
partial acceptance and rollback are covered on the random Llama (test_engine.py)."""

from __future__ import annotations

import pytest

from drafter_lab.data.conversations import read_conversations
from drafter_lab.spec.eval import evaluate, render_prompts
from drafter_lab.targets.hf import load_target

from .conftest import greedy_continuations, make_drafter, one_thread, train_on


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from drafter_lab.targets.build import build_pair

    out = tmp_path_factory.mktemp("pair") / "micro"
    with one_thread():
        build_pair("micro", out, drift=1.0, cache_dir=out.parent / "cache")
    return out


@pytest.mark.parametrize("side", ["base", "tuned"])
def test_lossless_chain_and_tree_on_the_pair(pair, side):
    target = load_target(pair / side)
    convs, _ = read_conversations(pair / "prompts-eval.jsonl")
    convs = convs[:4]
    seqs = greedy_continuations(target, render_prompts(target.tokenizer, convs), new_tokens=32)
    drafter = train_on(target, make_drafter(target, seed=3), seqs, iters=40)
    chain = evaluate(target, drafter, convs, steps=4, topk=1, batch=2, max_new_tokens=32)
    tree = evaluate(target, drafter, convs, steps=3, topk=3, draft_tokens=8, batch=2, max_new_tokens=32)
    for r in (chain, tree):
        assert r["lossless_check"] == "identical"  # evaluate raises on any difference
        assert r["served_accept_len"] > 1.5
        assert r["spec_tok_s"] > 0 and r["baseline_tok_s"] > 0
