"""Draft trees: candidate bookkeeping, top-T selection, and the verify tree's attention layout.

Every row of a batch drafts the same number of nodes, so trees are stored as dense tensors:

    tokens  [B, N]  target token ids; node 0 is the root (the last emitted token, not yet verified)
    parents [B, N]  local index of each node's parent (-1 for the root); parents precede children
    depth   [B, N]  0 for the root; the node's position offset in the verify pass
    q       [B, N, V] or None: the proposal each node's token was drawn from (sampled chains);
                    None means the tokens were chosen deterministically (proposal = one-hot)

A chain is the tree where node i's parent is i - 1. A node that is its own parent is padding: it is
verified with the rest (rows of a batch have the same node count) but is nobody's child, so no walk
ever reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    q: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def drafted(self) -> torch.Tensor:
        """[B] draft tokens per row: nodes other than the root and padding."""
        own = torch.arange(self.size, device=self.parents.device)
        return (self.parents != own).sum(1) - 1

    def ancestors(self) -> torch.Tensor:
        """[B, N, N] bool: node j is node i or one of its ancestors (the tree attention mask)."""
        B, N = self.tokens.shape
        anc = torch.eye(N, dtype=torch.bool, device=self.tokens.device).expand(B, N, N).clone()
        rows = torch.arange(B, device=self.tokens.device)
        for i in range(1, N):  # parents precede children, so anc[parent] is complete
            anc[:, i] |= anc[rows, self.parents[:, i]]
        return anc

    def children(self, node: torch.Tensor, rank: int) -> torch.Tensor:
        """Local index of the rank-th child (in node order) of node[b] per row, -1 where none."""
        own = torch.arange(self.size, device=self.parents.device)
        is_child = (self.parents == node[:, None]) & (own != node[:, None])  # a pad is its own parent, not child
        nth = torch.cumsum(is_child.long(), dim=1) - 1
        hit = is_child & (nth == rank)
        idx = torch.argmax(hit.long(), dim=1)
        return torch.where(hit.any(1), idx, torch.full_like(idx, -1))


def chain(root: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None = None) -> DraftTree:
    """A chain tree: root [B] followed by drafts [B, S] (q [B, S+1, V] with a zero row for the root)."""
    B, S = drafts.shape
    idx = torch.arange(S + 1, device=root.device)
    return DraftTree(
        tokens=torch.cat([root[:, None], drafts], 1),
        parents=(idx - 1).expand(B, S + 1).clone(),
        depth=idx.expand(B, S + 1).clone(),
        q=q,
    )


def padded_tree(root: torch.Tensor, drafts: list[list[tuple[int, int]]], pad_id: int) -> DraftTree:
    """Trees of different sizes per row: root [B], and per row its drafted nodes as (token, parent),
    parent a local index (0 = the root, i = the row's i-th node; parents first). Rows are padded to
    the largest with nodes that can never be accepted."""
    N = 1 + max((len(d) for d in drafts), default=0)
    tokens, parents, depth = [], [], []
    for r, nodes in zip(root.tolist(), drafts):  # lists first: one tensor per field, not one write per node
        d = [0]
        for _, parent in nodes:
            d.append(d[parent] + 1)
        pad = range(len(nodes) + 1, N)
        tokens.append([r] + [t for t, _ in nodes] + [pad_id] * len(pad))
        parents.append([-1] + [p for _, p in nodes] + list(pad))
        depth.append(d + [0] * len(pad))
    dev = root.device
    return DraftTree(torch.tensor(tokens, dtype=root.dtype, device=dev), torch.tensor(parents, device=dev),
                     torch.tensor(depth, device=dev))


class Candidates:
    """Nodes generated while drafting a tree, in creation order (so parents precede children).

    Each node keeps its token, cumulative log-prob score and the candidate index of its parent
    (-1 = the root). `select(T)` takes the T best-scoring nodes: a child's score never exceeds its
    parent's and the parent was created first, so a stable sort by score keeps every selected
    node's parent selected too. -inf scores tie in creation order; NaN sorts above every number, so a
    child of a finite parent must not score NaN (`DrafterRunner.draft_tree` ranks it as -inf).
    """

    def __init__(self):
        self.tokens, self.scores, self.parents, self.depths = [], [], [], []
        self.count = 0

    def add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        """Add [B, n] nodes; returns their candidate indices [n]."""
        n = tokens.shape[1]
        self.tokens.append(tokens)
        self.scores.append(scores)
        self.parents.append(parents)
        self.depths.append(torch.full_like(tokens, depth))
        idx = torch.arange(self.count, self.count + n, device=tokens.device)
        self.count += n
        return idx

    def select(self, root: torch.Tensor, draft_tokens: int) -> DraftTree:
        tokens = torch.cat(self.tokens, 1)
        scores = torch.cat(self.scores, 1)
        parents = torch.cat(self.parents, 1)
        depths = torch.cat(self.depths, 1)
        B, M = tokens.shape
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :draft_tokens]
        chosen = torch.sort(order, dim=1).values  # creation order: parents first
        # local index of each candidate in the verify tree (root = 0, chosen nodes = 1..T)
        local = torch.full((B, M), -1, dtype=torch.long, device=tokens.device)
        local.scatter_(1, chosen, torch.arange(1, draft_tokens + 1, device=tokens.device).expand(B, -1))
        gparent = parents.gather(1, chosen)
        lparent = torch.where(gparent < 0, torch.zeros_like(gparent), local.gather(1, gparent.clamp_min(0)))
        zero = torch.zeros(B, 1, dtype=torch.long, device=tokens.device)
        return DraftTree(
            tokens=torch.cat([root[:, None], tokens.gather(1, chosen)], 1),
            parents=torch.cat([zero - 1, lparent], 1),
            depth=torch.cat([zero, depths.gather(1, chosen)], 1),
        )
