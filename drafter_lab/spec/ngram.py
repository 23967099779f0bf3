"""N-gram drafting ("prompt lookup"): the drafter-free baseline a trained drafter has to beat.

vLLM serves it as `method: ngram` (`prompt_lookup_min/max`), SGLang as its NGRAM algorithm, and
the seeds turned to it once their transfer failed. Each cycle, per row: find the longest suffix of
the row's tokens so far (prompt + output), between `min_n` and `max_n` tokens long, that occurred
earlier; propose the (up to) `steps` tokens that followed its most recent earlier occurrence
(vLLM's proposer takes the earliest one, so a suffix that recurs can draft otherwise there). No
match proposes nothing, and the row verifies its root alone. With `across_prompts`, rows decoded
earlier by the same drafter are looked up too, after the row's own tokens at each length (SGLang's
NGRAM keeps such a cache across requests).

With topk K > 1 a row drafts a tree instead, as SGLang's NGRAM does: the continuations of the K
most recent occurrences with distinct continuations (longest suffix first, then shorter ones,
the row's own tokens before earlier rows at each length), merged into a trie of at most
`draft_tokens` nodes, the most recent continuation first.

Rows of a batch draft different sizes: the verify tree is padded to the largest with nodes that
can never be accepted (`tree.padded_tree`). Drafts are deterministic, so sampling verifies them as
one-hot proposals and stays lossless.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import torch

from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.tree import DraftTree, padded_tree


def continuations_reference(tokens: list[int], steps: int, k: int, cfg: NgramConfig,
                            earlier: list[list[int]] = ()) -> list[list[int]]:
    """The definition, by scanning: the continuations `NgramDrafter` merges for a row, with
    `earlier` the rows finished before it (oldest first) when looking across prompts."""
    L, out = len(tokens), []
    for n in range(min(cfg.max_n, L), cfg.min_n - 1, -1):
        suffix = tokens[L - n:]
        sources = [(tokens, L - 1)] if n < L else []
        sources += [(row, len(row) - 1) for row in reversed(earlier)]
        for seq, last_end in sources:
            for start in range(last_end - n, -1, -1):  # most recent occurrence first
                cont = seq[start + n: start + n + steps]
                if seq[start: start + n] == suffix and cont not in out:
                    out.append(cont)
                    if len(out) == k:
                        return out
    return out


def trie(continuations: list[list[int]], budget: int) -> list[tuple[int, int]]:
    """The continuations merged, in order, into at most `budget` nodes (token, parent): parent 0 is
    the root, i the i-th node."""
    nodes: list[tuple[int, int]] = []
    child: dict[tuple[int, int], int] = {}
    for seq in continuations:
        parent = 0
        for token in seq:
            if (parent, token) not in child:
                if len(nodes) == budget:
                    return nodes
                nodes.append((token, parent))
                child[parent, token] = len(nodes)
            parent = child[parent, token]
    return nodes


class NgramIndex:
    """n-grams of a token list -> where the continuations of their occurrences start, oldest first.

    An n-gram is indexed once a token follows it: a row's lookup must not find its own suffix, and
    a finished row's last n-grams have no continuation. A decoding row's index grows (`grow`), the
    finished rows' is added to a row at a time (`add_row`).
    """

    def __init__(self, cfg: NgramConfig):
        self.cfg = cfg
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # continuations starting at or before this position are indexed
        self.row_ends: list[int] = []  # where each row added by `add_row` ends in `tokens`
        self.steps = 0  # the continuation length `distinct` holds
        # n-gram -> (its distinct final continuations in the order of their most recent occurrences, a
        # dict as an ordered set; how many of its `after` entries they cover): a lookup skips repeats
        # instead of reading every occurrence each cycle (topk > 1 was quadratic over a decode)
        self.distinct: dict[tuple[int, ...], tuple[dict[tuple[int, ...], None], int]] = {}

    def grow(self, tokens: list[int]) -> None:
        """`tokens` is this list grown by appends (a row as it decodes)."""
        self._index(tokens, len(tokens) - 1, first=0)

    def add_row(self, row: list[int]) -> None:
        """Append a finished row: its n-grams, none spanning into the row before it."""
        first = len(self.tokens)
        self.tokens.extend(row)
        self._index(self.tokens, len(self.tokens) - 1, first)
        self.row_ends.append(len(self.tokens))

    def _index(self, tokens: list[int], last: int, first: int) -> None:
        lo, hi = self.cfg.min_n, self.cfg.max_n
        for end in range(max(self.indexed, first) + 1, last + 1):  # n-grams tokens[end - n: end]
            for n in range(lo, min(hi, end - first) + 1):
                self.after.setdefault(tuple(tokens[end - n: end]), []).append(end)
        self.tokens, self.indexed = tokens, max(self.indexed, last)

    def continuations(self, gram: tuple[int, ...], steps: int) -> Iterator[list[int]]:
        """The distinct continuations of `gram`'s occurrences, most recent first: `steps` tokens, fewer
        where the row ends."""
        starts = self.after.get(gram)
        if not starts:
            return
        # final: every added row's continuation, a grown row's once `steps` tokens follow it
        final = len(starts) if self.row_ends else bisect.bisect_right(starts, len(self.tokens) - steps)
        for s in reversed(starts[final:]):
            yield self.tokens[s: s + steps]  # still growing: each the only one of its length
        if not final:
            return
        yield self._continuation(starts[final - 1], steps)  # before merging: topk 1 needs no more
        if steps != self.steps:
            self.steps, self.distinct = steps, {}
        seen, done = self.distinct.get(gram, ({}, 0))
        for s in starts[done:final]:
            cont = tuple(self._continuation(s, steps))
            seen.pop(cont, None)  # re-inserted: ordered by its most recent occurrence
            seen[cont] = None
        self.distinct[gram] = seen, final
        rest = reversed(seen)
        next(rest)  # the most recent, yielded above
        for cont in rest:
            yield list(cont)

    def _continuation(self, start: int, steps: int) -> list[int]:
        """The final continuation starting at `start`: `steps` tokens, fewer where its row ends."""
        ends = self.row_ends
        stop = min(start + steps, ends[bisect.bisect_right(ends, start)]) if ends else start + steps
        return self.tokens[start: stop]


class NgramDrafter:
    """Drafts from each row's own tokens (and, across prompts, from rows finished before);
    `SpecEngine` takes it in place of an EAGLE-3 drafter."""

    def __init__(self, cfg: NgramConfig | None = None):
        self.cfg = cfg or NgramConfig()
        self.rows: list[NgramIndex] = []
        self.earlier = NgramIndex(self.cfg)

    def forget(self) -> None:
        """Drop the rows finished so far (a measurement starts from none)."""
        self.earlier = NgramIndex(self.cfg)

    def reset(self, batch: int) -> None:
        self.rows = [NgramIndex(self.cfg) for _ in range(batch)]

    def join(self, n: int) -> None:
        """n new rows join the batch, after its rows (continuous batching)."""
        self.rows += [NgramIndex(self.cfg) for _ in range(n)]

    def keep(self, rows: list[int]) -> None:
        """Only these rows stay in the batch, in this order."""
        self.rows = [self.rows[b] for b in rows]

    def finish(self, histories: list[list[int]]) -> None:
        """These rows are done: rows decoded after them may look them up (across prompts)."""
        if self.cfg.across_prompts:
            for h in histories:
                self.earlier.add_row(h)

    def continuations(self, index: NgramIndex, tokens: list[int], steps: int, k: int) -> list[list[int]]:
        """Up to k distinct continuations of the row's suffixes, most telling first (see the module)."""
        index.grow(tokens)
        L, out = len(tokens), []
        for n in range(min(self.cfg.max_n, L), self.cfg.min_n - 1, -1):
            for source in (index, self.earlier):
                for cont in source.continuations(tuple(tokens[L - n:]), steps):
                    if cont not in out:
                        out.append(cont)
                        if len(out) == k:
                            return out
        return out

    def draft(self, root: torch.Tensor, histories: list[list[int] | None], steps: int, topk: int, draft_tokens: int,
              pad_id: int) -> DraftTree:
        """histories[b]: row b's prompt and emitted tokens, ending at the root (not yet verified); None for a
        finished row, which drafts nothing."""
        drafts = [[] if h is None else trie(self.continuations(index, h, steps, topk), draft_tokens)
                  for index, h in zip(self.rows, histories)]
        return padded_tree(root, drafts, pad_id)
