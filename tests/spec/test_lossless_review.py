"""Speculative decoding emits exactly the target's tokens: statistical checks on tiny vocabularies.

The target is a Markov chain over V tokens (its next-token distribution depends on the last token
only: P[last]), and so is the drafter (Q[last]), so whole decodes run vectorised over many rows with
`sampled_walk`, cycle after cycle (the bonus is the next root). The drafter is wrong on purpose in
several ways; the first four emitted tokens must follow the chain's exact law, and the first
verify step's accept length its exact law (moving to a child happens with min(p, q) for a sampled
draft and with p for a deterministic one). Greedy walks are checked against a plain reference with
ties in the logits, and the engine at temperature > 0 with a smaller draft vocabulary (d2t), eos
and max_new_tokens below the draft depth.

Every check is seeded; a correct implementation fails one with probability about 1e-6 per check
(chi-square at that level), while the bugs tried on these tests (residual skipped, bonus from p, q
ignored, the residual not shrinking across siblings, a counting slip) fail them by far.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from drafter_lab.spec.accept import greedy_walk, sampled_walk
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.tree import Candidates, DraftTree, chain, padded_tree

from .conftest import make_drafter
from .test_sampling import _tiny_target

V = 6
R0 = 2  # the last prompt token


def _chi2_bound(df: int, tail_z: float = 4.75) -> float:
    """Chi-square upper quantile (Wilson-Hilferty) at about 1e-6 one-sided."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + tail_z * math.sqrt(a)) ** 3


def assert_follows(codes: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """Samples `codes` (ints) follow the distribution `exact`: none where it is 0, chi-square below
    its 1e-6 quantile over the cells expecting >= 5 (the rest pooled, as one more cell if that
    expects >= 5)."""
    exact = exact.double().flatten()
    n = codes.numel()
    seen = torch.bincount(codes.flatten(), minlength=exact.numel()).double()
    assert seen.numel() == exact.numel(), what
    assert float(seen[exact <= 1e-12].sum()) == 0, f"{what}: tokens the target never emits were emitted"
    want = exact * n
    big = want >= 5
    obs, exp = seen[big].clone(), want[big].clone()
    if float(want[~big].sum()) >= 5:
        obs, exp = torch.cat([obs, seen[~big].sum()[None]]), torch.cat([exp, want[~big].sum()[None]])
    else:  # too little to stand alone: pooled into the least expected cell
        obs[exp.argmin()] += seen[~big].sum()
        exp[exp.argmin()] += want[~big].sum()
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    bound = _chi2_bound(max(1, obs.numel() - 1))
    assert chi2 < bound, f"{what}: chi2 {chi2:.1f} >= {bound:.1f}"


def markov(seed: int, peak: float = 1.5, zeros: int = 1) -> torch.Tensor:
    """A random [V, V] transition matrix with `zeros` impossible next tokens per row."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(peak * torch.randn(V, V, generator=g, dtype=torch.double), -1)
    for t in range(V):
        P[t, torch.randperm(V, generator=g)[:zeros]] = 0.0
    return (P / P.sum(-1, keepdim=True)).float()


def decode(P: torch.Tensor, build, rows: int, n: int, seed: int):
    """Decode `n` tokens per row after R0, drafting each cycle with build(root, g) -> DraftTree.
    Returns the tokens [rows, n] and the first verify step's accept lengths [rows]."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((rows, n), -1, dtype=torch.long)
    filled = torch.zeros(rows, dtype=torch.long)
    root = torch.full((rows,), R0, dtype=torch.long)
    ar = torch.arange(rows)
    first = None
    while bool((filled < n).any()):
        tree = build(root, g)
        path, counts, bonus = sampled_walk(tree, P[tree.tokens], g)
        toks = tree.tokens.gather(1, path.clamp_min(0))
        emitted = torch.roll(toks, -1, 1)
        emitted[ar, counts - 1] = bonus
        for j in range(emitted.shape[1]):
            m = (j < counts) & (filled + j < n)
            out[m, filled[m] + j] = emitted[m, j]
        filled += counts
        root = bonus
        first = counts if first is None else first
    return out, first


def check_tokens(out: torch.Tensor, P: torch.Tensor, what: str) -> None:
    """out [rows, 4] follows the chain from R0: t1, (t1, t2), (t1, t2, t3), (t2, t3) and (t3, t4),
    the last being the bonus after 3 accepted drafts where a verify accepts them all."""
    p = P.double()
    joint2 = p[R0][:, None] * p
    joint3 = joint2[:, :, None] * p[None]
    assert_follows(out[:, 0], p[R0], f"{what}: first token")
    assert_follows(out[:, 0] * V + out[:, 1], joint2, f"{what}: first two tokens")
    assert_follows(out[:, 0] * V * V + out[:, 1] * V + out[:, 2], joint3, f"{what}: first three tokens")
    assert_follows(out[:, 1] * V + out[:, 2], joint3.sum(0), f"{what}: second and third tokens")
    assert_follows(out[:, 2] * V + out[:, 3], joint3.sum((0, 1))[:, None] * p, f"{what}: third and fourth tokens")


# ---------------------------------------------------------------- sampled chains (proposal q)

def sampled_chain_builder(Q: torch.Tensor, steps: int):
    def build(root, g):
        drafts, qs, prev = [], [torch.zeros(root.shape[0], V)], root
        for _ in range(steps):
            q = Q[prev]
            prev = torch.multinomial(q, 1, generator=g)[:, 0]
            drafts.append(prev)
            qs.append(q)
        return chain(root, torch.stack(drafts, 1), torch.stack(qs, 1))
    return build


def exact_chain_counts(P: torch.Tensor, Q: torch.Tensor, steps: int) -> torch.Tensor:
    """Accept length law of one sampled-chain verify from R0: a draft x at state t is accepted with
    probability min(P, Q)[t, x] (drawn with Q, kept with min(1, P/Q))."""
    move = torch.minimum(P.double(), Q.double())
    at = torch.zeros(V, dtype=torch.double)
    at[R0] = 1.0
    law = torch.zeros(steps + 2, dtype=torch.double)
    for k in range(steps):
        nxt = at @ move
        law[k + 1] = at.sum() - nxt.sum()
        at = nxt
    law[steps + 1] = at.sum()
    return law


def _proposals(P: torch.Tensor, kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    if kind == "identical":
        return P.clone()
    if kind == "uniform":
        return torch.full((V, V), 1.0 / V)
    if kind == "mass-where-target-has-none":  # most of q on the token p gives 0
        Q = 0.3 * P.clone()
        Q[P == 0] = 0.7
        return Q / Q.sum(-1, keepdim=True)
    if kind == "misses-tokens":  # q only on p's 2 least likely tokens (with p > 0)
        Q = torch.zeros(V, V)
        for t in range(V):
            support = torch.nonzero(P[t] > 0)[:, 0]
            low = support[P[t, support].argsort()[:2]]
            Q[t, low] = torch.rand(2, generator=g) + 0.1
        return Q / Q.sum(-1, keepdim=True)
    if kind == "top2-sharpened":  # a drafter's renormalised top-k at a lower temperature
        sharp = P ** 3
        Q = torch.zeros(V, V).scatter_(1, sharp.topk(2, -1).indices, sharp.topk(2, -1).values)
        return Q / Q.sum(-1, keepdim=True)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["identical", "uniform", "mass-where-target-has-none", "misses-tokens",
                                  "top2-sharpened"])
def test_sampled_chain_emits_the_target_chain(kind):
    P = markov(0)
    Q = _proposals(P, kind)
    steps, rows = 3, 60_000
    out, first = decode(P, sampled_chain_builder(Q, steps), rows, 4, seed=1)
    check_tokens(out, P, kind)
    law = exact_chain_counts(P, Q, steps)
    assert_follows(first, law, f"{kind}: accept lengths")
    if kind == "identical":  # every draft accepted: the bonus comes after all of them
        assert bool((first == steps + 1).all())


# ---------------------------------------------------------------- deterministic trees (one-hot)

def ranked_children(Q: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k]: each token's children, the drafter's top-k (stable order)."""
    return torch.sort(Q, dim=-1, descending=True, stable=True).indices[:, :k]


def full_tree_builder(C: torch.Tensor, depth: int):
    """Every node expanded to its row of C [V, k] (duplicates allowed), down to `depth`."""
    k = C.shape[1]
    parents, depths, rank = [-1], [0], [0]
    level = [0]
    for d in range(1, depth + 1):
        nxt = []
        for p in level:
            for r in range(k):
                parents.append(p), depths.append(d), rank.append(r)
                nxt.append(len(parents) - 1)
        level = nxt

    def build(root, g):
        B, N = root.shape[0], len(parents)
        tokens = torch.empty(B, N, dtype=torch.long)
        tokens[:, 0] = root
        for i in range(1, N):
            tokens[:, i] = C[tokens[:, parents[i]], rank[i]]
        return DraftTree(tokens, torch.tensor(parents).expand(B, N).clone(), torch.tensor(depths).expand(B, N).clone())
    return build


def candidates_builder(Q: torch.Tensor, k: int, steps: int, draft_tokens: int):
    """As `DrafterRunner.draft_tree`: a beam of k per depth, scored by cumulative log Q, the best
    `draft_tokens` selected by `Candidates.select` (so rows' trees differ with their roots)."""
    logq = Q.clamp_min(1e-30).log()
    C = ranked_children(Q, k)

    def build(root, g):
        B = root.shape[0]
        cands = Candidates()
        tok = C[root]
        score = logq[root[:, None], tok]
        idx = cands.add(tok, score, torch.full_like(tok, -1), 1).expand(B, k)
        for depth in range(1, steps):
            child = C[tok].reshape(B, k * k)
            scores = (score[:, :, None] + logq[tok[:, :, None], C[tok]]).reshape(B, k * k)
            child_idx = cands.add(child, scores, idx[:, :, None].expand(B, k, k).reshape(B, k * k), depth + 1)
            score, pick = scores.topk(k, 1)
            tok, idx = child.gather(1, pick), child_idx[pick]
        return cands.select(root, draft_tokens)
    return build


def padded_builder(C: torch.Tensor, pad_id: int):
    """Trees of different shapes per root token, padded to the largest (n-gram style)."""
    shapes = {}
    for t in range(V):  # root t: a chain of (t % 3) + 1 nodes, and a second root child if t is even
        nodes, parent, tok = [], 0, t
        for _ in range(t % 3 + 1):
            tok = int(C[tok, 0])
            nodes.append((tok, parent))
            parent = len(nodes)
        if t % 2 == 0:
            nodes.append((int(C[t, 1]), 0))
        shapes[t] = nodes

    def build(root, g):
        return padded_tree(root, [shapes[t] for t in root.tolist()], pad_id)
    return build


def exact_tree_counts(tree: DraftTree, P: torch.Tensor) -> torch.Tensor:
    """Accept length law of one verify of a deterministic tree (row 0): the walk moves to the first
    child carrying token x with probability p(x), so a node is reached with the product of p along
    its path, and the walk ends there with 1 - p(its children's distinct tokens)."""
    tokens, parents, depth = (t[0].tolist() for t in (tree.tokens, tree.parents, tree.depth))
    law = torch.zeros(max(depth) + 2, dtype=torch.double)
    reach = {0: 1.0}
    for i in range(len(tokens)):
        if i not in reach:
            continue
        seen, moved = set(), 0.0
        for j in range(i + 1, len(tokens)):
            if parents[j] == i and tokens[j] not in seen:
                seen.add(tokens[j])
                reach[j] = reach[i] * float(P[tokens[i], tokens[j]])
                moved += float(P[tokens[i], tokens[j]])
        law[depth[i] + 1] += reach[i] * (1.0 - moved)
    return law


@pytest.mark.parametrize("shape", ["binary-depth3", "ternary-depth2", "duplicate-siblings", "candidates",
                                   "padded"])
def test_tree_emits_the_target_chain(shape):
    P = markov(2)
    Q = _proposals(P, "uniform") + 0.5 * P  # drafter ranks close to, not equal to, the target's
    if shape == "binary-depth3":
        build = full_tree_builder(ranked_children(Q, 2), 3)
    elif shape == "ternary-depth2":
        build = full_tree_builder(ranked_children(Q, 3), 2)
    elif shape == "duplicate-siblings":  # [a, a, b]: the second a is never reachable
        C = ranked_children(Q, 2)
        build = full_tree_builder(torch.stack([C[:, 0], C[:, 0], C[:, 1]], 1), 2)
    elif shape == "candidates":
        build = candidates_builder(Q, 2, 3, 5)
    else:
        build = padded_builder(ranked_children(Q, 2), pad_id=int(P[R0].argmax()))  # padding carries a likely token
    rows = 30_000 if shape == "padded" else 60_000  # padded trees are built a row at a time
    out, first = decode(P, build, rows, 4, seed=3)
    check_tokens(out, P, shape)
    law = exact_tree_counts(build(torch.tensor([R0]), None), P)
    assert law[2:].sum() > 0.3  # drafts are accepted often enough to test what follows them
    assert_follows(first, law, f"{shape}: accept lengths")


def test_sampled_walk_takes_the_first_of_duplicate_siblings_only():
    """A sibling repeating a rejected token is never accepted (its residual mass is 0), and a node
    whose parent was rejected is never reached, however likely its token."""
    P = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 4)
    # root(0) -> 1, 1 (duplicate), 3 (impossible); node 1 -> 2; node 2 (the duplicate) -> 1
    tree = DraftTree(torch.tensor([[0, 1, 1, 3, 2, 1]]).expand(20_000, 6).clone(),
                     torch.tensor([[-1, 0, 0, 0, 1, 2]]).expand(20_000, 6).clone(),
                     torch.tensor([[0, 1, 1, 1, 2, 2]]).expand(20_000, 6).clone())
    g = torch.Generator().manual_seed(0)
    path, counts, bonus = sampled_walk(tree, P[tree.tokens], g)
    assert set(path[:, 1].tolist()) == {-1, 1}
    assert set(path[:, 2].tolist()) <= {-1, 4}
    assert bool((bonus[path[:, 1] == -1] == 2).all())  # rejected at the root: the bonus is the other token
    assert bool((counts[path[:, 1] == 1] >= 2).all())


# ---------------------------------------------------------------- greedy

def reference_greedy(tokens, parents, logits):
    """Follow the target's argmax (lowest id among ties, as plain decoding's argmax) while some child
    of the current node carries it (the first such child)."""
    cur, path = 0, [0]
    while True:
        want = int(logits[cur].argmax())
        kids = [j for j in range(len(tokens)) if parents[j] == cur and j != cur and tokens[j] == want]
        if not kids:
            return path, want
        cur = kids[0]
        path.append(cur)


def test_greedy_walk_matches_plain_argmax_decoding_with_ties():
    """Small-integer logits tie often; random trees with duplicate siblings and padding nodes."""
    g = torch.Generator().manual_seed(4)
    rows = []
    for _ in range(300):
        n = int(torch.randint(1, 9, (1,), generator=g))
        nodes = [(int(torch.randint(0, 4, (1,), generator=g)), int(torch.randint(0, i + 1, (1,), generator=g)))
                 for i in range(n)]
        rows.append(nodes)
    root = torch.randint(0, 4, (len(rows),), generator=g)
    tree = padded_tree(root, rows, pad_id=0)
    logits = torch.randint(0, 3, (*tree.tokens.shape, 4), generator=g).float()
    path, counts, bonus = greedy_walk(tree, logits)
    for b in range(len(rows)):
        want_path, want_bonus = reference_greedy(tree.tokens[b].tolist(), tree.parents[b].tolist(), logits[b])
        assert path[b, :counts[b]].tolist() == want_path
        assert bool((path[b, counts[b]:] == -1).all())
        assert int(bonus[b]) == want_bonus


# ---------------------------------------------------------------- the engine at temperature > 0

@pytest.mark.parametrize("mode", [dict(steps=3, topk=1, sample_topk=4), dict(steps=3, topk=2, draft_tokens=5)],
                         ids=["sampled-chain", "tree"])
def test_engine_sampling_with_draft_vocab_eos_and_a_short_budget(tmp_path: Path, mode):
    """At temperature 0.7, with a draft vocab of half the target's (d2t), an eos, and max_new_tokens 2
    below the draft depth 3: the first token follows the target, the second follows it given a first
    that is not eos, a row ends at eos or at 2 tokens, and accept lengths add up to each output."""
    target = _tiny_target(tmp_path)
    Vt = target.vocab_size
    used = torch.tensor([1, 3, 4, 7, 9, 10])
    drafter = make_drafter(target, used, seed=5)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(40.0)
    prompt = [3, 7, 1, 4]
    T = 0.7

    def exact_next(prefixes):
        with torch.no_grad():
            return torch.softmax(target.model(torch.tensor(prefixes)).logits[:, -1].double() / T, -1)

    p1 = exact_next([prompt])[0]
    p2 = exact_next([prompt + [a] for a in range(Vt)])
    eos = int(p1.argsort()[-3])  # likely enough as a first token, not the likeliest
    rows = 3000
    engine = SpecEngine(target, drafter, SpecConfig(temperature=T, max_new_tokens=2, **mode))
    engine.eos = {eos}
    gen = engine.generate([prompt] * rows, generator=torch.Generator().manual_seed(0))
    first = torch.tensor([o[0] for o in gen.tokens])
    assert_follows(first, p1, "first token")
    assert all(len(o) == (1 if o[0] == eos else 2) for o in gen.tokens)
    pairs = torch.tensor([o[0] * Vt + o[1] for o in gen.tokens if o[0] != eos])
    cont = p1[:, None] * p2
    cont[eos] = 0
    assert_follows(pairs, cont / cont.sum(), "first two tokens")
    assert sum(gen.accept_lengths) == sum(len(o) - 1 for o in gen.tokens)
    assert max(gen.accept_lengths) == 1  # one token was left to emit after the first
