"""Speculative decoding checked against from-scratch recomputation, on a tiny target.

- the verify pass: every tree node's logits and aux states equal a plain forward over the row's
  committed tokens and the node's path, cycle after cycle (tree mask, positions, commit compaction);
- an oracle drafter that drafts the target's true greedy continuation to a chosen depth among
  distractors: the output is the target's greedy output and every step's accept length is exactly
  that depth + the bonus, cut at eos and max_new_tokens;
- the drafter's step 0 after each cycle equals a fresh extend over the committed tokens (rollback);
- recursive rejection over a full tree emits exactly the target's joint distribution.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from drafter_lab.spec.accept import sampled_walk
from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import DraftTree, padded_tree

from .conftest import make_drafter

V = 40


def tiny_target(tmp_path, peak: float, seed: int = 0):
    """A random 3-layer Llama over a 40-token vocabulary; `peak` scales its head (no tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from drafter_lab.targets.hf import Target

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, eos_token_id=None, pad_token_id=0,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(peak)
    model.requires_grad_(False)
    return Target(path=tmp_path, model=model, tokenizer=None, fingerprint="tiny")


def forward_last(target, seq: list[int], aux_ids=(1, 2)):
    """A plain forward over `seq`: the last position's logits and aux states."""
    with torch.no_grad():
        out = target.model(torch.tensor([seq]), output_hidden_states=True)
    return out.logits[0, -1], torch.cat([out.hidden_states[i][0, -1] for i in aux_ids])


def full_greedy(target, prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(forward_last(target, seq)[0].argmax()))
    return seq[len(prompt):]


def random_prompts(rng: random.Random, lengths) -> list[list[int]]:
    return [[rng.randrange(1, V) for _ in range(n)] for n in lengths]


def test_verify_matches_plain_forward_across_cycles(tmp_path):
    """Rows of different lengths, padded branchy trees of different sizes, a random path committed
    per row each cycle (the slots in between go dead): every node's logits and aux states are those
    of a plain forward over the row's committed tokens followed by the node's path."""
    target = tiny_target(tmp_path, peak=1.0)
    rng = random.Random(0)
    runner = TargetRunner(target.model, [1, 2], target.path)
    prompts = random_prompts(rng, (1, 6, 3, 9))
    B = len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    ids = torch.zeros(B, int(lens.max()), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    logits, _ = runner.prefill(ids, lens)
    for b in range(B):
        torch.testing.assert_close(logits[b], forward_last(target, prompts[b])[0], rtol=1e-4, atol=1e-4)
    committed = [list(p) for p in prompts]
    roots = [rng.randrange(V) for _ in prompts]
    for _ in range(6):
        drafts = [[(rng.randrange(V), rng.randint(0, i)) for i in range(rng.randint(0, 7))] for _ in prompts]
        tree = padded_tree(torch.tensor(roots), drafts, 0)
        logits, aux = runner.verify(tree.tokens, tree.depth, tree.ancestors())
        path = torch.full((B, int(tree.depth.max()) + 1), -1)
        counts = torch.zeros(B, dtype=torch.long)
        for b in range(B):
            for i in range(1 + len(drafts[b])):
                node_path, j = [], i
                while j >= 0:
                    node_path.insert(0, int(tree.tokens[b, j]))
                    j = int(tree.parents[b, j])
                want_logits, want_aux = forward_last(target, committed[b] + node_path)
                torch.testing.assert_close(logits[b, i], want_logits, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(aux[b, i], want_aux, rtol=1e-4, atol=1e-4)
            cur, accepted = 0, [0]  # a random root-to-node path, stopping anywhere
            while rng.random() > 0.2:
                kids = [i for i in range(1, 1 + len(drafts[b])) if int(tree.parents[b, i]) == cur]
                if not kids:
                    break
                cur = rng.choice(kids)
                accepted.append(cur)
            path[b, :len(accepted)] = torch.tensor(accepted)
            counts[b] = len(accepted)
            committed[b] += [int(tree.tokens[b, k]) for k in accepted]
        runner.commit(path, counts, tree.size)
        assert runner.lens.tolist() == [len(c) for c in committed]
        roots = [rng.randrange(V) for _ in prompts]


class OracleDrafter(NgramDrafter):
    """Drafts, per row, a random tree holding the target's greedy continuation to a random depth k
    (the rest distractors that the target never accepts), and records what each unfinished row must
    emit: the k drafts and the bonus, cut at the first eos and at max_new_tokens."""

    def __init__(self, refs, prompts, eos, max_new, seed):
        super().__init__(NgramConfig(1, 2))
        self.refs, self.prompts, self.eos, self.max_new = refs, prompts, eos, max_new
        self.rng = random.Random(seed)
        self.expected: list[int] = []
        self.cut = {"eos": 0, "max_new_tokens": 0}  # steps whose run was cut inside, by what

    def draft(self, root, histories, steps, topk, draft_tokens, pad_id) -> DraftTree:
        rng, rows = self.rng, []
        for h in histories:
            if h is None:  # a finished row drafts nothing
                rows.append([])
                continue
            i = next(i for i, p in enumerate(self.prompts) if h == p + self.refs[i][:len(h) - len(p)])
            out = h[len(self.prompts[i]):]
            true = self.refs[i][len(out):len(out) + steps + 1]  # the greedy drafts, then the bonus
            # the row's last token within reach: force a run past it, cut inside (not just at its end)
            end = min([self.max_new - len(out)] + [j + 1 for j, t in enumerate(true) if t in self.eos])
            k = steps if end <= steps else rng.randint(0, steps - 1 if end == steps + 1 else steps)
            nodes, depth_of, spine = [], {0: 0}, [0]  # depth_of: spine node -> its depth
            size = k + rng.randint(0, 6)
            while len(nodes) < size:
                if len(spine) <= k and (rng.random() < 0.4 or size - len(nodes) <= k - len(spine) + 1):
                    nodes.append((true[len(spine) - 1], spine[-1]))
                    spine.append(len(nodes))
                    depth_of[len(nodes)] = len(spine) - 1
                    continue
                parent = rng.randint(0, len(nodes))
                tok = rng.randrange(V)
                if parent in depth_of and tok == true[depth_of[parent]]:
                    tok = (tok + 1) % V  # a distractor never equals the target's choice
                nodes.append((tok, parent))
            rows.append(nodes)
            if len(out) < self.max_new and not set(out) & self.eos:
                run = true[:k + 1]
                cut = next((j + 1 for j, t in enumerate(run) if t in self.eos), len(run))
                left = self.max_new - len(out)
                if min(cut, left) < len(run):
                    self.cut["eos" if cut <= left else "max_new_tokens"] += 1
                self.expected.append(min(cut, left))
        return padded_tree(root, rows, pad_id)


@pytest.mark.parametrize("steps", [1, 3, 6])
@pytest.mark.parametrize("slots", [None, 2])
def test_oracle_drafts_give_exact_accept_lengths(tmp_path, steps, slots):
    """Greedy output equals the target's (recomputed from scratch per token) and each verify step
    emits exactly the oracle's correct depth + 1 (the bonus counted once), none past eos or
    max_new_tokens; eos ends rows inside accepted runs."""
    target = tiny_target(tmp_path, peak=30.0)
    rng = random.Random(steps)
    prompts = random_prompts(rng, (1, 7, 3, 12, 2))
    max_new = 22
    refs = [full_greedy(target, p, max_new + steps + 1) for p in prompts]
    # eos: a token some reference emits late but not in its first 5 tokens
    early = {t for r in refs for t in r[:5]}
    eos = {next(t for r in refs for t in r[5:max_new] if t not in early)}
    want = []
    for r in refs:
        cut = next((j + 1 for j, t in enumerate(r) if t in eos), len(r))
        want.append(r[:min(cut, max_new)])
    assert any(len(w) < max_new for w in want) and any(len(w) == max_new for w in want)
    oracle = OracleDrafter(refs, prompts, eos, max_new, seed=steps)
    engine = SpecEngine(target, oracle, SpecConfig(steps=steps, topk=1, max_new_tokens=max_new))
    engine.eos = eos
    gen = engine.generate(prompts, slots=slots)
    assert gen.tokens == want
    assert gen.accept_lengths == oracle.expected
    assert max(gen.accept_lengths) == steps + 1
    assert min(oracle.cut.values()) > 0  # runs cut inside by eos and by max_new_tokens
    assert sum(gen.accept_lengths) == sum(len(w) - 1 for w in want)


@pytest.mark.parametrize("mode", [dict(steps=3, topk=1), dict(steps=3, topk=2, draft_tokens=5),
                                  dict(steps=2, topk=1, temperature=1.0)], ids=["chain", "tree", "sampled-chain"])
def test_drafter_step0_after_each_cycle_equals_a_fresh_extend(tmp_path, mode):
    """After each verify and rollback, the drafter's next draft step 0 (hidden state, top-k) is what a
    fresh drafter computes over the row's committed tokens: rejected drafts leave no trace in its cache."""
    target = tiny_target(tmp_path, peak=3.0)
    drafter = make_drafter(target, seed=4)
    with torch.no_grad():  # large weights: every cache entry moves the drafter's state
        for name, w in drafter.named_parameters():
            if w.dim() == 2 and not name.startswith("embed"):
                w.mul_(3.0)
    prompts = random_prompts(random.Random(0), (1, 6, 3, 9))
    engine = SpecEngine(target, drafter, SpecConfig(max_new_tokens=15, stop_at_eos=False, **mode))
    seen = []
    extend = engine.drafter.extend

    def recording(*args):
        step0 = extend(*args)
        seen.append((engine.drafter.lens.clone(), [t.clone() for t in step0]))
        return step0

    engine.drafter.extend = recording
    gen = engine.generate(prompts, generator=torch.Generator().manual_seed(0))
    checked = 0
    for lens, (h, top, logp) in seen[1:]:  # seen[0]: the prefill
        for b, p in enumerate(prompts):
            n, seq = int(lens[b]), p + gen.tokens[b]
            if n + 1 >= len(seq):  # the row's last cycle: its step 0 is never used
                continue
            with torch.no_grad():
                hs = target.model(torch.tensor([seq[:n]]), output_hidden_states=True).hidden_states
            aux = torch.cat([hs[i] for i in drafter.config.aux_layer_ids], -1)
            fresh = DrafterRunner(drafter, use_fused=False)
            fresh.reset(1, n + 1, "cpu")
            h_ref, top_ref, logp_ref = fresh.extend(torch.tensor([seq[1:n + 1]]), aux, torch.tensor([n]), top.shape[1])
            torch.testing.assert_close(h[b], h_ref[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(logp[b], logp_ref[0], rtol=1e-4, atol=1e-4)
            assert torch.equal(top[b], top_ref[0])
            checked += 1
    assert checked > 20
    assert any(a < engine.cfg.max_accept for a in gen.accept_lengths)  # rejections: rollback ran


def test_recursive_rejection_over_a_full_tree_emits_the_joint_distribution():
    """Every token is a child at every node of a depth-2 tree over 3 tokens (siblings in scrambled
    order): the walk always accepts two drafts, and (draft, draft, bonus) must follow
    p0(a) p_a(b) p_ab(c), which needs the right residual at every sibling rank and depth."""
    g = torch.Generator().manual_seed(0)
    W, R = 3, 200_000
    tokens, parents, depth = [0], [-1], [0]
    first = {}
    for a in (2, 0, 1):
        tokens.append(a), parents.append(0), depth.append(1)
        first[a] = len(tokens) - 1
    second = {}
    for a in (2, 0, 1):
        for b in (1, 2, 0):
            tokens.append(b), parents.append(first[a]), depth.append(2)
            second[a, b] = len(tokens) - 1
    N = len(tokens)
    probs = torch.softmax(2 * torch.randn(N, W, generator=g), -1)
    tree = DraftTree(*(torch.tensor(x).expand(R, N).clone() for x in (tokens, parents, depth)))
    path, counts, bonus = sampled_walk(tree, probs.expand(R, N, W), g)
    assert (counts == 3).all()
    toks = tree.tokens.gather(1, path)
    seen = torch.bincount(toks[:, 1] * W * W + toks[:, 2] * W + bonus, minlength=W ** 3).double() / R
    exact = torch.tensor([float(probs[0, a] * probs[first[a], b] * probs[second[a, b], c])
                          for a, b, c in itertools.product(range(W), repeat=3)], dtype=torch.double)
    assert 0.5 * float((seen - exact).abs().sum()) < 0.01
