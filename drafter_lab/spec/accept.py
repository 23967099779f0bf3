"""What the verifier accepts: walks down a verified draft tree, and served accept-length statistics.

A walk starts at the root (the last emitted token) and moves to the child whose token the target
accepts, until no child is accepted; the target's token at the last node reached is the bonus.
It returns, per row:

    path   [B, D+1]  local node indices of the accepted path, root first, -1 past its end
    counts [B]       tokens emitted by this verify step = accepted drafts + the bonus token
                     (= the *served* accept length of the step, DESIGN section 3)
    bonus  [B]       the token the target adds after the accepted drafts
"""

from __future__ import annotations

from collections import Counter

import torch

from drafter_lab.errors import LabError
from drafter_lab.spec.sampling import accept_probability, one_hot, residual, sample
from drafter_lab.spec.tree import DraftTree


def _start(tree: DraftTree):
    B = tree.tokens.shape[0]
    dev = tree.tokens.device
    path = torch.full((B, int(tree.depth.max()) + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    return torch.arange(B, device=dev), path, torch.ones(B, dtype=torch.long, device=dev)


@torch.no_grad()
def greedy_walk(tree: DraftTree, logits: torch.Tensor):
    """Accept a child iff its token is the target's argmax at the current node."""
    rows, path, counts = _start(tree)
    target = logits.argmax(-1)  # [B, N]
    cur = torch.zeros_like(counts)
    for level in range(1, path.shape[1]):  # a row that found no child keeps its node, so finds none again
        want = target[rows, cur]
        match = (tree.parents == cur[:, None]) & (tree.tokens == want[:, None])
        found = match.any(1)
        cur = torch.where(found, match.long().argmax(1), cur)
        path[:, level] = torch.where(found, cur, path[:, level])
        counts += found.long()
    return path, counts, target[rows, cur]


@torch.no_grad()
def sampled_walk(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None):
    """Lossless rejection down the tree; probs [B, N, V] are the target's distributions per node.

    At each node the children are tried in node order on a shrinking residual: a child with
    proposal q (tree.q; one-hot for deterministic drafts) is accepted with
    min(1, r(x)/q(x)), else r <- norm(max(r - q, 0)). With no child accepted the bonus is drawn
    from r. Sampled chains have one child per node drawn from q (speculative sampling); trees
    have deterministic children (recursive rejection with one-hot proposals). Either way each
    emitted token is distributed as the target's.
    """
    rows, path, counts = _start(tree)
    B, N, V = probs.shape
    cur = torch.zeros_like(counts)
    live = torch.ones(B, dtype=torch.bool, device=probs.device)
    bonus = torch.zeros_like(counts)
    resid = probs[:, 0]
    for level in range(1, path.shape[1] + 1):
        moved = torch.zeros_like(live)
        rank = 0
        while True:
            child = tree.children(cur, rank)
            active = live & ~moved & (child >= 0)
            if not bool(active.any()):
                break
            c = child.clamp_min(0)
            x = tree.tokens[rows, c]
            q = one_hot(x, V) if tree.q is None else tree.q[rows, c]
            u = torch.rand(B, device=probs.device, generator=generator)
            acc = active & (u < accept_probability(resid, q, x))
            rej = active & ~acc
            resid = torch.where(rej[:, None], residual(resid, q), resid)
            cur = torch.where(acc, c, cur)
            moved |= acc
            rank += 1
        finished = live & ~moved
        if bool(finished.any()):
            bonus = torch.where(finished, sample(resid, generator), bonus)
        live = moved
        if not bool(live.any()):
            break
        path[:, level] = torch.where(live, cur, path[:, level])
        counts += live.long()
        resid = torch.where(live[:, None], probs[rows, cur], resid)
    return path, counts, bonus


def accept_summary(accept_lengths: list[int], max_len: int) -> dict:
    """Served accept length (mean tokens per verify step, bonus included) and its histogram over 1..max_len,
    the most one verify step can emit (its deepest draft path and the bonus). No decode emits a length
    outside that: one is refused, where the histogram (which prices the accept length per depth) left its
    step out while the mean counted it."""
    if bad := [n for n in accept_lengths if not 1 <= n <= max_len]:
        raise LabError(f"served accept length {bad[0]} is outside 1..{max_len}: a verify step emits the bonus token "
                       f"and at most {max_len - 1} accepted drafts")
    hist = Counter(accept_lengths)
    n = len(accept_lengths)
    return {
        "served_accept_len": (sum(accept_lengths) / n) if n else float("nan"),
        "verify_steps": n,
        "histogram": {str(k): hist.get(k, 0) for k in range(1, max_len + 1)},
    }
