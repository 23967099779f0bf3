"""A finished row riding along in a static batch stays within its bound (session 69, h2).

It committed its whole last accepted path, past max_new_tokens or eos, and was verified with a full
draft every cycle after: up to steps + 1 positions past the positions `check_positions` admits, an
IndexError in a learned-position target's table (GPT-2's wpe)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.targets.hf import load_target


@pytest.fixture(scope="module")
def counting_gpt2(tmp_path_factory):
    """A real GPT-2 (learned positions, 55 of them) that greedily emits (t + 1) % 64 after any token t:
    one-hot embeddings, blocks that add nothing, an lm_head whose row t + 1 reads t."""
    from transformers import GPT2Config, GPT2LMHeadModel

    V = 64
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=V, n_layer=1, n_head=4, n_positions=55,
                                       tie_word_embeddings=False, eos_token_id=None, bos_token_id=None))
    with torch.no_grad():
        for name, w in model.named_parameters():
            if "c_proj" in name or name.endswith("wpe.weight"):
                w.zero_()
        model.transformer.wte.weight.copy_(torch.eye(V))
        model.lm_head.weight.copy_(torch.eye(V).roll(1, 0))
    out = tmp_path_factory.mktemp("gpt2") / "model"
    model.save_pretrained(out)
    return load_target(out, tokenizer=False)


def test_a_finished_row_rides_along_within_a_learned_position_table(counting_gpt2):
    """Row 0 (the longest prompt) repeats a run the n-gram lookup drafts from, so it accepts all 4 drafts
    per cycle and has 11 of its 12 tokens after 2 cycles; row 1 drafts nothing and takes 11. Row 0's deepest
    draft may reach position 54, the table's last. Its third cycle emits 1 token but committed all 5 (to 55),
    and it went on drafting 4 more from there: an IndexError. Now it commits what it emits (51) and is
    verified as its root alone, so the passes after shrink to the root (row 1 drafts nothing either)."""
    target = counting_gpt2
    assert target.config.max_position_embeddings == 55
    prompts = [list(range(1, 31)) + list(range(1, 11)), [40]]
    cfg = SpecConfig(steps=4, max_new_tokens=12, stop_at_eos=False)
    engine = SpecEngine(target, NgramDrafter(NgramConfig(1, 3)), cfg)
    engine.check_positions(prompts)  # at the edge: 40 + 12 + 4 - 2 = 54
    base = engine.generate(prompts, speculative=False)
    assert base.tokens == [list(range(11, 23)), list(range(41, 53))]
    lens, sizes = [], []
    commit, verify = engine.target.commit, engine.target.verify

    def recording(path, counts, verified):
        commit(path, counts, verified)
        lens.append(engine.target.lens.tolist())

    def sized(tokens, depth, ancestors, aux=True):
        sizes.append(tokens.shape[1])
        return verify(tokens, depth, ancestors, aux=aux)

    engine.target.commit, engine.target.verify = recording, sized
    gen = engine.generate(prompts)
    assert gen.tokens == base.tokens
    assert gen.accept_lengths[:6] == [5, 1, 5, 1, 1, 1]  # row 0's third step: 1 of its 5 accepted emitted
    # the cache holds the emitted tokens but the last (the root a next draft would start from): 40 + 12 - 1
    assert [b for b, _ in lens] == [45, 50, 51, 51, 51, 51, 51, 51, 51, 51, 51]
    assert [b for _, b in lens] == list(range(2, 13))
    assert sizes == [5, 5, 5] + [1] * 8 and gen.no_draft_passes == 8


@pytest.mark.parametrize("mode", [dict(steps=4), dict(steps=3, topk=2, draft_tokens=5),
                                  dict(steps=3, temperature=1.0, sample_topk=4)],
                         ids=["chain", "tree", "sampled-chain"])
def test_every_row_is_verified_within_the_bound_its_output_needs(target, trained_drafter, prompts, mode):
    """EAGLE-3 drafting, rows ending at different cycles (max_new_tokens and eos): each verify pass reaches
    no row's position past len(prompt) + max_new_tokens + steps - 2 (`check_positions`' bound), a finished
    row is verified as its root alone, and greedy output is the target's own."""
    greedy = SpecEngine(target, None, SpecConfig(max_new_tokens=14))
    greedy.eos = {greedy.generate(prompts, speculative=False).tokens[1][5]}  # some rows end early at it
    base = greedy.generate(prompts, speculative=False).tokens
    assert len({len(b) for b in base}) > 1
    cfg = SpecConfig(max_new_tokens=14, **mode)
    engine = SpecEngine(target, trained_drafter, cfg)
    engine.eos = greedy.eos
    bound = torch.tensor([len(p) + cfg.max_new_tokens + cfg.steps - 2 for p in prompts])
    deepest, roots_alone, lens = torch.zeros(len(prompts), dtype=torch.long), [], {}
    verify, commit, extend = engine.target.verify, engine.target.commit, engine.drafter.extend

    def recording(tokens, depth, ancestors, aux=True):
        deepest.copy_(torch.maximum(deepest, (engine.target.lens[:, None] + depth).max(1).values))
        roots_alone.append(((depth == 0) & ancestors.diagonal(0, 1, 2)).all(1).tolist())
        return verify(tokens, depth, ancestors, aux=aux)

    def committing(path, counts, verified):
        commit(path, counts, verified)
        lens["target"] = engine.target.lens.tolist()

    def extending(*args):
        step0 = extend(*args)
        lens["drafter"] = engine.drafter.lens.tolist()
        return step0

    engine.target.verify, engine.target.commit, engine.drafter.extend = recording, committing, extending
    gen = engine.generate(prompts, generator=torch.Generator().manual_seed(0))
    assert gen.tokens == base or cfg.temperature > 0
    assert (deepest <= bound).all(), (deepest - bound).tolist()
    # an unfinished row always has an EAGLE draft: the rows verified with one are the accept lengths'
    assert sum(not alone for r in roots_alone for alone in r) == len(gen.accept_lengths)
    assert any(map(any, roots_alone))  # rows ended at different passes
    for r, after in zip(roots_alone, roots_alone[1:]):  # once finished, a row stays its root alone
        assert all(b for a, b in zip(r, after) if a)
    # each cache holds a row's tokens but its last (the root a next draft would start from), and no more
    assert lens["target"] == lens["drafter"] == [len(p) + len(o) - 1 for p, o in zip(prompts, gen.tokens)]
