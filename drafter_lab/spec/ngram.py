"""N-gram drafting ("prompt lookup"): the drafter-free baseline a trained drafter has to beat.

vLLM serves it as `method: ngram` (`prompt_lookup_min/max`), SGLang as its NGRAM algorithm, and
the seeds turned to it once their transfer failed. Each cycle, per row: find the longest suffix of
the row's tokens so far (prompt + output), between `min_n` and `max_n` tokens long, that occurred
earlier; propose the (up to) `steps` tokens that followed its most recent earlier occurrence. No
match proposes nothing, and the row verifies its root alone.

Rows of a batch propose different lengths: the verify tree is the longest row's chain, and the
shorter rows are padded with nodes that can never be accepted (`tree.padded_chain`). Proposals
are deterministic, so sampling verifies them as one-hot proposals and stays lossless.
"""

from __future__ import annotations

import torch

from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.tree import DraftTree, padded_chain


def propose_reference(tokens: list[int], steps: int, cfg: NgramConfig) -> list[int]:
    """The definition, by scanning: what `NgramIndex.propose` must return."""
    L = len(tokens)
    for n in range(min(cfg.max_n, L - 1), cfg.min_n - 1, -1):
        suffix = tokens[L - n:]
        for start in range(L - n - 1, -1, -1):  # most recent earlier occurrence first
            if tokens[start: start + n] == suffix:
                return tokens[start + n: start + n + steps]
    return []


class NgramIndex:
    """One row's n-grams -> where their most recent occurrence ended, updated as the row grows.

    A lookup must not find the suffix itself, so n-grams ending at the last token are indexed only
    once another token follows them.
    """

    def __init__(self, cfg: NgramConfig):
        self.cfg = cfg
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in `after`

    def propose(self, tokens: list[int], steps: int) -> list[int]:
        """`tokens` is the row so far; it only ever grows between calls."""
        lo, hi = self.cfg.min_n, self.cfg.max_n
        for end in range(self.indexed + 1, len(tokens)):  # n-grams tokens[end - n: end]
            for n in range(lo, min(hi, end) + 1):
                self.after[tuple(tokens[end - n: end])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)
        for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
            start = self.after.get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return tokens[start: start + steps]
        return []


class NgramDrafter:
    """Proposes chains from each row's own tokens; `SpecEngine` takes it in place of an EAGLE-3 drafter."""

    def __init__(self, cfg: NgramConfig | None = None):
        self.cfg = cfg or NgramConfig()
        self.rows: list[NgramIndex] = []

    def reset(self, batch: int) -> None:
        self.rows = [NgramIndex(self.cfg) for _ in range(batch)]

    def draft(self, root: torch.Tensor, histories: list[list[int]], steps: int, pad_id: int) -> DraftTree:
        """histories[b]: row b's prompt and emitted tokens, ending at the root (not yet verified)."""
        proposals = [index.propose(h, steps) for index, h in zip(self.rows, histories)]
        return padded_chain(root, proposals, pad_id)
