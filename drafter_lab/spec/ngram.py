"""N-gram drafting ("prompt lookup"): the drafter-free baseline a trained drafter has to beat.

vLLM serves it as `method: ngram` (`prompt_lookup_min/max`), SGLang as its NGRAM algorithm, and
the seeds turned to it once their transfer failed. Each cycle, per row: find the longest suffix of
the row's tokens so far (prompt + output), between `min_n` and `max_n` tokens long, that occurred
earlier; propose the (up to) `steps` tokens that followed its most recent earlier occurrence. No
match proposes nothing, and the row verifies its root alone. With `across_prompts`, rows decoded
earlier by the same drafter are looked up too, after the row's own tokens at each length (SGLang's
NGRAM keeps such a cache across requests).

Rows of a batch propose different lengths: the verify tree is the longest row's chain, and the
shorter rows are padded with nodes that can never be accepted (`tree.padded_chain`). Proposals
are deterministic, so sampling verifies them as one-hot proposals and stays lossless.
"""

from __future__ import annotations

import bisect

import torch

from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.tree import DraftTree, padded_chain


def _latest(tokens: list[int], suffix: list[int], last_end: int, steps: int) -> list[int] | None:
    """The continuation of the most recent occurrence of `suffix` ending at or before `last_end`."""
    n = len(suffix)
    for start in range(last_end - n, -1, -1):
        if tokens[start: start + n] == suffix:
            return tokens[start + n: start + n + steps]
    return None


def propose_reference(tokens: list[int], steps: int, cfg: NgramConfig, earlier: list[list[int]] = ()) -> list[int]:
    """The definition, by scanning: what `NgramDrafter` proposes for a row, with `earlier` the rows
    finished before it (oldest first) when looking across prompts."""
    L = len(tokens)
    for n in range(min(cfg.max_n, L), cfg.min_n - 1, -1):
        suffix = tokens[L - n:]
        found = _latest(tokens, suffix, L - 1, steps) if n < L else None
        for row in reversed(earlier):
            if found is None:
                found = _latest(row, suffix, len(row) - 1, steps)
        if found:
            return found
    return []


class NgramIndex:
    """n-grams of a token list -> where the continuation of their most recent occurrence starts.

    An n-gram is indexed once a token follows it: a row's lookup must not find its own suffix, and
    a finished row's last n-grams have no continuation.
    """

    def __init__(self, cfg: NgramConfig):
        self.cfg = cfg
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # continuations starting before this position are indexed

    def grow(self, tokens: list[int]) -> None:
        """`tokens` is this list grown by appends (a row as it decodes)."""
        self._index(tokens, len(tokens) - 1, first=0)

    def add_row(self, row: list[int]) -> None:
        """Append a finished row: its n-grams, none spanning into the row before it."""
        first = len(self.tokens)
        self.tokens.extend(row)
        self._index(self.tokens, len(self.tokens) - 1, first)

    def _index(self, tokens: list[int], last: int, first: int) -> None:
        lo, hi = self.cfg.min_n, self.cfg.max_n
        for end in range(max(self.indexed, first) + 1, last + 1):  # n-grams tokens[end - n: end]
            for n in range(lo, min(hi, end - first) + 1):
                self.after[tuple(tokens[end - n: end])] = end
        self.tokens, self.indexed = tokens, max(self.indexed, last)

    def find(self, suffix: tuple[int, ...], steps: int, limit: int | None = None) -> list[int] | None:
        """Continuation of the suffix's most recent indexed occurrence, cut at `limit` (a row's end)."""
        start = self.after.get(suffix)
        if start is None:
            return None
        return self.tokens[start: min(start + steps, limit if limit is not None else len(self.tokens))]


class NgramDrafter:
    """Proposes chains from each row's own tokens (and, across prompts, from rows finished before);
    `SpecEngine` takes it in place of an EAGLE-3 drafter."""

    def __init__(self, cfg: NgramConfig | None = None):
        self.cfg = cfg or NgramConfig()
        self.rows: list[NgramIndex] = []
        self.earlier = NgramIndex(self.cfg)
        self.row_ends: list[int] = []  # where each finished row ends in `earlier.tokens`

    def forget(self) -> None:
        """Drop the rows finished so far (a measurement starts from none)."""
        self.earlier, self.row_ends = NgramIndex(self.cfg), []

    def reset(self, batch: int) -> None:
        self.rows = [NgramIndex(self.cfg) for _ in range(batch)]

    def finish(self, histories: list[list[int]]) -> None:
        """The batch's rows are done: later batches may look them up (across prompts)."""
        if self.cfg.across_prompts:
            for h in histories:
                self.earlier.add_row(h)
                self.row_ends.append(len(self.earlier.tokens))

    def propose(self, index: NgramIndex, tokens: list[int], steps: int) -> list[int]:
        index.grow(tokens)
        L = len(tokens)
        for n in range(min(self.cfg.max_n, L), self.cfg.min_n - 1, -1):
            suffix = tuple(tokens[L - n:])
            found = index.find(suffix, steps)
            if found is None and self.row_ends:
                start = self.earlier.after.get(suffix)
                if start is not None:  # cut at the end of the row it lies in
                    found = self.earlier.find(suffix, steps, self.row_ends[bisect.bisect_right(self.row_ends, start)])
            if found:
                return found
        return []

    def draft(self, root: torch.Tensor, histories: list[list[int]], steps: int, pad_id: int) -> DraftTree:
        """histories[b]: row b's prompt and emitted tokens, ending at the root (not yet verified)."""
        proposals = [self.propose(index, h, steps) for index, h in zip(self.rows, histories)]
        return padded_chain(root, proposals, pad_id)
