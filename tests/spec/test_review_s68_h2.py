"""N-gram trees (topk > 1): lookups merge the repeats of a continuation once instead of scanning every
occurrence each cycle, with the same drafts as the scanning definition (session 68, h2)."""

from __future__ import annotations

import random

import pytest
import torch

from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.ngram import NgramDrafter, continuations_reference
from drafter_lab.spec.ngram_config import NgramConfig


def _text(rng: random.Random, n: int) -> list[int]:
    """Tokens with many repeats: periodic runs (one continuation, many occurrences) between random ones."""
    out: list[int] = []
    while len(out) < n:
        if rng.random() < 0.5:
            period = [rng.randrange(4) for _ in range(rng.randrange(1, 5))]
            out += period * rng.randrange(2, 8)
        else:
            out += [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
    return out[:n]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("across", [False, True], ids=["own-row", "across-prompts"])
@pytest.mark.parametrize("sizes", [(1, 1), (1, 3), (2, 4)])
def test_decoding_rows_draft_what_the_scanning_definition_drafts(sizes, across, k):
    """Rows decoded as the engine does (the same `steps` every cycle, a few tokens per cycle), so that
    merged continuations carry over between cycles; a row now and then changes `steps` mid-row."""
    cfg = NgramConfig(*sizes, across_prompts=across)
    rng = random.Random(hash((sizes, across, k)))
    drafter, earlier, several = NgramDrafter(cfg), [], 0
    for _ in range(12):
        text, steps = _text(rng, 150), rng.randrange(1, 5)
        drafter.reset(1)
        length = rng.randrange(1, 6)
        while length < len(text):
            if rng.random() < 0.05:
                steps = rng.randrange(1, 5)
            tokens = text[:length]
            got = drafter.continuations(drafter.rows[0], tokens, steps, k)
            assert got == continuations_reference(tokens, steps, k, cfg, earlier), (tokens, steps)
            several += len(got) > 1
            length += rng.randrange(1, 4)
        drafter.finish([text])
        earlier += [text] if across else []
    assert several > 200


class _CountingList(list):
    """A token list that counts the reads of its elements (a lookup's work)."""

    reads = 0

    def __getitem__(self, key):
        self.reads += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("across", [False, True], ids=["own-row", "across-prompts"])
def test_topk_lookups_do_not_rescan_every_occurrence(across):
    """A periodic row: every suffix recurs at each period with the same continuation. Scanning found the
    K distinct ones only after reading every occurrence, each cycle (quadratic over a decode; the earlier
    rows' too, across prompts); merged, a cycle reads a bounded number, however long the row."""
    period = [3, 1, 4, 1, 5]
    row = period * 200
    drafter = NgramDrafter(NgramConfig(2, 4, across_prompts=across))
    earlier = _CountingList()
    drafter.earlier.tokens = earlier  # finished rows are appended to it
    drafter.finish([period * 200])
    drafter.reset(1)
    per_cycle = []
    for length in range(500, len(row), 3):
        tokens = _CountingList(row[:length])
        before = earlier.reads
        got = drafter.continuations(drafter.rows[0], tokens, 4, 4)
        assert got[0] == row[length - 5: length - 1]  # the period goes on
        per_cycle.append(tokens.reads + earlier.reads - before)
    # each of the first 5 cycles looks up suffixes new to it (one per phase of the period) and merges their
    # occurrences once; after them a cycle reads about 30 tokens, where scanning read 300 to 1200, growing
    assert max(per_cycle[5:]) <= 40, per_cycle


@pytest.mark.parametrize("across", [False, True], ids=["own-row", "across-prompts"])
def test_an_index_yields_each_continuation_once_most_recent_first(across):
    """[1, 2]'s continuations (3 tokens) in a growing row or in finished rows: each once, at its most recent
    occurrence, whether merged in this lookup or an earlier one; a finished row's are cut at its end."""
    drafter = NgramDrafter(NgramConfig(2, 2, across_prompts=across))
    rows = [[1, 2, 7, 8, 9, 1, 2, 5, 1, 2, 7, 8, 9, 1, 2, 5, 1, 2, 6], [0, 1, 2, 5, 1, 2, 5, 1, 2]]
    drafter.finish(rows)
    drafter.reset(1)
    index = drafter.earlier if across else drafter.rows[0]
    for _ in range(2):  # merged in the first lookup, then taken from what it merged
        if not across:
            index.grow(rows[0])
        got = list(index.continuations((1, 2), 3))
        assert got == ([[5, 1, 2], [6], [7, 8, 9]] if across else [[6], [5, 1, 2], [7, 8, 9]])


def test_extend_commits_what_one_reference_draft_step_per_position_commits(random_drafter, target):
    """`extend`'s m queries at once against the reference's one at a time, on fresh random inputs: each row's
    last hidden state and top-k, and the cache slots written. The row reaching furthest commits all m, so its
    last query needs the key it writes itself (a cache cut one slot short still decoded losslessly)."""
    d, (B, m, topk) = random_drafter, (3, 5, 3)
    g = torch.Generator().manual_seed(11)
    runner = DrafterRunner(d, use_fused=False)
    runner.reset(B, 16, "cpu")
    runner.k.normal_(generator=g), runner.v.normal_(generator=g)  # what earlier cycles left there
    lens, counts = torch.tensor([0, 2, 4]), torch.tensor([1, 3, m])
    runner.lens = lens.clone()
    k_ref, v_ref = runner.k.clone(), runner.v.clone()
    ids = torch.randint(0, target.vocab_size, (B, m), generator=g)
    aux = torch.randn(B, m, 3 * d.config.target_hidden_size, generator=g)
    last, top, top_logp = runner.extend(ids, aux, counts, topk)
    for b in range(B):
        for j in range(int(counts[b])):
            pos = lens[b: b + 1] + j
            h, ref_top, ref_logp = d.draft_step(d.embed(ids[b: b + 1, j]), aux[b: b + 1, j], pos, k_ref[b: b + 1],
                                                v_ref[b: b + 1], pos, topk)
        torch.testing.assert_close(last[b], h[0], rtol=1e-4, atol=1e-5)
        assert top[b].tolist() == ref_top[0].tolist()
        torch.testing.assert_close(top_logp[b], ref_logp[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(runner.k, k_ref), torch.testing.assert_close(runner.v, v_ref)
    assert runner.lens.tolist() == (lens + counts).tolist()
