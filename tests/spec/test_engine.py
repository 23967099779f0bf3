"""Speculative decoding is lossless: greedy output with a drafter equals the target's own greedy output."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine

from .conftest import late_tokens, make_drafter

MODES = [
    pytest.param(dict(steps=4, topk=1), id="chain"),
    pytest.param(dict(steps=3, topk=3, draft_tokens=7), id="tree"),
]


def hf_greedy(target, prompt, n):
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("mode", MODES)
def test_random_drafter_lossless_batch1_matches_hf_generate(target, random_drafter, prompts, mode):
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=20, stop_at_eos=False, **mode))
    spec = engine.generate(prompts[:1])
    assert spec.tokens[0] == hf_greedy(target, prompts[0], 20)
    assert len(spec.accept_lengths) == spec.verify_passes


@pytest.mark.parametrize("mode", MODES)
def test_random_drafter_lossless_batch(target, random_drafter, prompts, mode):
    engine = SpecEngine(target, random_drafter, SpecConfig(max_new_tokens=24, stop_at_eos=False, **mode))
    base = engine.generate(prompts, speculative=False)
    spec = engine.generate(prompts)
    assert spec.tokens == base.tokens
    assert all(len(t) == 24 for t in spec.tokens)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 4])
def test_trained_drafter_accepts_and_rolls_back_losslessly(target, trained_drafter, prompts, mode, batch):
    engine = SpecEngine(target, trained_drafter, SpecConfig(max_new_tokens=40, stop_at_eos=False, **mode))
    spec_tokens, accept = [], []
    for i in range(0, 4, batch):
        g = engine.generate(prompts[i:i + batch])
        spec_tokens += g.tokens
        accept += g.accept_lengths
    base = engine.generate(prompts[:4], speculative=False).tokens
    assert spec_tokens == base
    top = engine.cfg.max_accept
    assert sum(accept) / len(accept) > 2.0  # several tokens per verify step
    assert any(a < top for a in accept)  # and rejections: rollback happened
    assert all(1 <= a <= top for a in accept)
    # each verify step counts what it emitted: the output past the prefill's token, none cut at max_new_tokens
    assert sum(accept) == sum(len(t) - 1 for t in spec_tokens)


def test_batch_rows_of_different_lengths_and_eos(target, trained_drafter, prompts):
    """A row that ends early (eos) stops committing while the others go on; outputs still match."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=4, max_new_tokens=30))
    base = engine.generate(prompts[:3], speculative=False)
    engine.eos = {base.tokens[1][6]}  # make row 1's 7th token an end of sequence
    base = engine.generate(prompts[:3], speculative=False)
    spec = engine.generate(prompts[:3])
    assert spec.tokens == base.tokens
    assert len(base.tokens[1]) <= 7 and base.tokens[1][-1] in engine.eos
    assert sum(spec.accept_lengths) == sum(len(t) - 1 for t in spec.tokens)  # none counted past an eos


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("slots", [1, 2, 4])
def test_continuous_batching_is_lossless_and_never_carries_a_finished_row(target, trained_drafter, prompts, mode,
                                                                          slots):
    """Rows end at different passes (eos, max_new_tokens); with slots the next prompt takes a finished
    row's place, so every row in a pass is unfinished, and each prompt still gets its own output."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(max_new_tokens=30, **mode))
    engine.eos = late_tokens(engine.generate(prompts, speculative=False).tokens, first=3)
    base = engine.generate(prompts, speculative=False)
    assert len({len(t) for t in base.tokens}) > 2 and min(map(len, base.tokens)) >= 3
    for speculative in (False, True):
        left = []
        g = engine.generate(prompts, speculative=speculative, slots=slots, on_finish=left.append)
        assert g.tokens == base.tokens and sum(left) == len(prompts) and len(left) > 1
        assert max(g.rows_per_pass) == min(g.rows_per_pass[0], slots) == slots
        assert sum(g.rows_per_pass) == len(g.accept_lengths)  # no finished row rides along
    static = engine.generate(prompts)
    assert set(static.rows_per_pass) == {len(prompts)} and sum(static.rows_per_pass) > len(static.accept_lengths)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("slots", [None, 2])
def test_streamed_tokens_add_up_to_each_output(target, trained_drafter, prompts, mode, slots):
    """on_tokens hands over each prompt's first token alone (its prefill's), then one piece per
    verify step of its row, cut at eos and max_new_tokens: the pieces add up to its output."""
    engine = SpecEngine(target, trained_drafter, SpecConfig(max_new_tokens=30, **mode))
    engine.eos = late_tokens(engine.generate(prompts, speculative=False).tokens, first=3)
    pieces = [[] for _ in prompts]
    g = engine.generate(prompts, slots=slots, on_tokens=lambda i, tokens: pieces[i].append(tokens))
    assert [[t for piece in p for t in piece] for p in pieces] == g.tokens
    assert all(len(p[0]) == 1 for p in pieces)
    assert sum(map(len, pieces)) == len(prompts) + len(g.accept_lengths)
    assert max(len(piece) for p in pieces for piece in p) > 1  # steps that accepted drafts


def test_each_prompt_is_timed_from_its_first_token_to_its_last(target, trained_drafter, prompts, monkeypatch):
    """On a clock that ticks one second per reading: a static batch's first tokens all come out of one
    prefill; one slot decodes the prompts one after another; every prompt ends at a cycle's walk."""
    from drafter_lab.spec import phases

    ticks = iter(range(10**6))
    monkeypatch.setattr(phases.time, "perf_counter", lambda: float(next(ticks)))
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=3, max_new_tokens=12))
    engine.eos = late_tokens(engine.generate(prompts, speculative=False).tokens, first=2)
    static = engine.generate(prompts)
    assert set(static.first_token_seconds) == {1.0}  # the prefill is the first mark
    assert len(set(static.finish_seconds)) > 1 and min(static.finish_seconds) > 1
    one = engine.generate(prompts, slots=1)
    assert one.tokens == static.tokens
    # marks: a prompt's prefill, then per cycle draft, verify, accept (its last token), extend; then
    # the row leaves (accept) and the next prompt's prefill
    for i in range(len(prompts)):
        assert (one.finish_seconds[i] - one.first_token_seconds[i]) % 4 == 3
        assert i == 0 or one.first_token_seconds[i] == one.finish_seconds[i - 1] + 3


def test_continuous_batching_admits_a_prompt_done_at_its_first_token(target, random_drafter, prompts):
    """A prompt whose first token ends it leaves before any cycle; the rest decode as usual."""
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=3, max_new_tokens=6))
    firsts = [t[0] for t in engine.generate(prompts, speculative=False).tokens]
    engine.eos = {firsts[2]}
    base = engine.generate(prompts, speculative=False)
    spec = engine.generate(prompts, slots=2)
    assert spec.tokens == base.tokens and [firsts[2]] in spec.tokens
    assert sum(spec.rows_per_pass) == len(spec.accept_lengths)


# The second case (s78 h13): the extend's key window ends at the furthest query, and that row commits all
# m positions (a full accept on the longest row), so its last query needs that very slot.
@pytest.mark.parametrize("m, S, start, counts, topk, seed", [(5, 16, [0, 3, 1], [5, 2, 4], 4, 0),
                                                             (3, 8, [2, 0], [3, 1], 3, 2)])
def test_extend_matches_sequential_draft_steps(target, random_drafter, m, S, start, counts, topk, seed):
    """The multi-position extend writes the same cache and returns the same step as draft_step calls."""
    d = random_drafter
    start, counts = torch.tensor(start), torch.tensor(counts)
    B = len(start)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (B, m), generator=g)
    aux = torch.randn(B, m, 3 * target.hidden_size, generator=g)

    runner = DrafterRunner(d, use_fused=False)
    runner.reset(B, S, "cpu")
    runner.k.normal_(generator=g)
    runner.v.normal_(generator=g)
    runner.lens = start.clone()
    k_ref, v_ref = runner.k.clone(), runner.v.clone()
    h, top, logp = runner.extend(ids, aux, counts, topk=topk)

    for b in range(B):
        for j in range(int(counts[b])):
            pos = start[b:b + 1] + j
            hb, tb, lb = d.draft_step(d.embed(ids[b:b + 1, j]), aux[b:b + 1, j], pos, k_ref[b:b + 1], v_ref[b:b + 1],
                                      pos, topk)
        torch.testing.assert_close(h[b], hb[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(top[b], tb[0])
        torch.testing.assert_close(logp[b], lb[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.k, k_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.v, v_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(runner.lens, start + counts)


def _prefill_and_extend(engine, runner, prompts, topk):
    """Target prefill of the prompts, then the drafter over them (as the engine's first cycle does):
    prompt lengths, the target's greedy root token, and the drafter's hidden state and top-k."""
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    ids = torch.zeros(B, int(lens.max()), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    logits, aux = engine.target.prefill(ids, lens)
    root = logits.argmax(-1)
    nxt = torch.roll(ids, -1, 1)
    nxt[torch.arange(B), lens - 1] = root
    runner.reset(B, 128, "cpu")
    h0, top, logp = runner.extend(nxt, aux, lens, topk)
    return lens, root, h0, top, logp


def test_full_two_level_tree_contains_the_chain(target, trained_drafter, prompts):
    """With every candidate kept (T = K + K*K), a depth-2 tree holds the top-1 chain from the same state."""
    runner = DrafterRunner(trained_drafter, use_fused=False)
    engine = SpecEngine(target, trained_drafter, SpecConfig(steps=2, topk=3))
    B = 3
    lens, root, h0, top, logp = _prefill_and_extend(engine, runner, prompts[:B], 3)
    k, v = runner.k.clone(), runner.v.clone()
    chain = runner.draft_chain(root, h0, top[:, :1], logp[:, :1], 2)
    runner.k, runner.v = k, v
    tree = runner.draft_tree(root, h0, top, logp, 2, 3, 3 + 9)
    for b in range(B):
        first = [i for i in range(1, tree.size) if tree.parents[b, i] == 0 and tree.tokens[b, i] == chain.tokens[b, 1]]
        assert len(first) == 1
        assert any(tree.parents[b, i] == first[0] and tree.tokens[b, i] == chain.tokens[b, 2] for i in range(tree.size))


def _sensitive_drafter(target, seed: int):
    """Large weights: every input (token, hidden, cache entry) moves the drafter's top-k."""
    d = make_drafter(target, seed=seed)
    with torch.no_grad():
        for name, w in d.named_parameters():
            if w.dim() == 2 and not name.startswith("embed"):
                w.mul_(10.0)
    return d


def test_greedy_chain_is_the_top1_tree(target):
    """draft_chain (no beam or candidate bookkeeping) drafts exactly the tree draft_tree drafts with
    topk 1, and leaves the committed lengths alone."""
    d, steps = _sensitive_drafter(target, seed=5), 5
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in (2, 4, 3, 5)]
    runner = DrafterRunner(d, use_fused=False)
    lens, root, h0, top, logp = _prefill_and_extend(SpecEngine(target, d, SpecConfig(steps=steps)), runner, prompts, 1)
    committed, k, v = runner.lens.clone(), runner.k.clone(), runner.v.clone()
    chain = runner.draft_chain(root, h0, top, logp, steps)
    assert torch.equal(runner.lens, committed) and chain.q is None
    runner.k, runner.v = k, v
    tree = runner.draft_tree(root, h0, top, logp, steps, 1, steps)
    for field in ("tokens", "parents", "depth"):
        assert torch.equal(getattr(chain, field), getattr(tree, field)), field


def test_fused_step_selection(target, random_drafter, prompts):
    from drafter_lab.kernels import draft_step as fused_op

    # auto on CPU: the reference step; forced off: the reference step
    assert not SpecEngine(target, random_drafter, SpecConfig(use_fused=None)).fused
    assert not SpecEngine(target, random_drafter, SpecConfig(use_fused=False)).fused
    # forced on: the kernels' draft_step with the op forced (the CPU op when built), lossless;
    # an unbuilt op is a one-line error
    engine = SpecEngine(target, random_drafter, SpecConfig(use_fused=True, max_new_tokens=4))
    assert engine.fused
    if fused_op.available("cpu"):
        assert engine.generate(prompts[:1]).tokens == engine.generate(prompts[:1], speculative=False).tokens
    else:
        with pytest.raises(LabError, match="draft_step"):
            engine.generate(prompts[:1])


def test_tree_children_are_the_drafters_topk_along_each_path(target):
    """Every expanded node's children equal the top-k of draft steps replayed along its own path
    (checks the beam's cache copies and their reordering when two beam nodes share a parent)."""
    d = _sensitive_drafter(target, seed=4)
    K, steps = 2, 4
    g = torch.Generator().manual_seed(0)  # short prompts: each drafted cache entry weighs in attention
    prompts = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in (2, 3, 2, 4, 3, 2, 5, 3)]
    runner = DrafterRunner(d, use_fused=False)
    engine = SpecEngine(target, d, SpecConfig(steps=steps, topk=K))
    B = len(prompts)
    lens, root, h0, top, logp = _prefill_and_extend(engine, runner, prompts, K)
    k, v = runner.k.clone(), runner.v.clone()
    tree = runner.draft_tree(root, h0, top, logp, steps, K, K + (steps - 1) * K * K)  # every candidate kept
    shared_parent = 0
    for b in range(B):
        tok, par = tree.tokens[b].tolist(), tree.parents[b].tolist()
        assert sorted(tok[i] for i in range(1, len(tok)) if par[i] == 0) == sorted(top[b].tolist())
        expanded = [n for n in range(1, len(tok)) if n in par]
        assert len(expanded) == K * (steps - 1)
        shared_parent += len(expanded) - len({par[n] for n in expanded})
        for n in expanded:
            kids = sorted(tok[i] for i in range(len(tok)) if par[i] == n)
            path, j = [], n
            while j > 0:
                path.insert(0, tok[j])
                j = par[j]
            kc, vc, h = k[b:b + 1].clone(), v[b:b + 1].clone(), h0[b:b + 1]
            for depth, t in enumerate(path):
                pos = lens[b:b + 1] + depth
                h, out, _ = d.draft_step(d.embed(torch.tensor([t])), h, pos, kc, vc, pos, K)
            assert kids == sorted(out[0].tolist())
    assert shared_parent > 0  # some beam took two children of one node: the cache reorder mattered



@pytest.mark.parametrize("over", [{"temperature": float("nan")}, {"temperature": float("inf")},
                                  {"temperature": -0.5}])
def test_a_temperature_that_is_no_finite_number_is_one_line(over):
    """nan passed `temperature < 0` and met torch.multinomial as a traceback."""
    from drafter_lab.errors import LabError

    with pytest.raises(LabError, match="temperature must be a finite number >= 0"):
        SpecConfig(**over)



def test_draft_tokens_on_a_chain_is_refused_not_ignored():
    """SGLang verifies steps + 1 tokens on a chain whatever --speculative-num-draft-tokens says; here a
    chain's draft_tokens other than its steps was silently ignored."""
    from drafter_lab.errors import LabError

    assert SpecConfig(steps=4, draft_tokens=4).tree_tokens == 4
    with pytest.raises(LabError, match="a chain verifies the 4 tokens it drafts: draft_tokens 2 applies to a tree"):
        SpecConfig(steps=4, draft_tokens=2)


@pytest.mark.parametrize("kw", [dict(topk=5, steps=2), dict(temperature=1.0, sample_topk=5)])
def test_topk_past_the_draft_vocab_is_one_line(target, kw):
    """A drafter cannot propose more children than its draft vocab holds (torch.topk's traceback)."""
    with pytest.raises(LabError, match="exceeds the drafter's draft vocab of 4 tokens"):
        SpecEngine(target, make_drafter(target, torch.arange(4)), SpecConfig(max_new_tokens=4, **kw))
