"""Mutation audit (review s63): the transfer report's position count under a token remap, and which of
two source tokens of the same bytes a token map picks."""

from __future__ import annotations

import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.transfer import init_from, token_map

from .test_transfer import USED_NEW, USED_SRC, N, V, fresh, source, target_head, vocab
from .test_transfer_review import TEXTS, sentencepiece


def test_positions_agree_counts_source_ids_under_a_token_remap(tmp_path):
    """A new tokenizer that renumbered every token, over the same draft tokens: each draft position i names
    the source's own token USED_SRC[i], so all N positions agree (as ids alone only 10 would)."""
    src, path = source(tmp_path, formats.SGLANG)
    tokens = torch.full((V,), -1, dtype=torch.long)
    tokens[torch.tensor(USED_NEW)] = torch.tensor(USED_SRC)
    drafter = fresh(src.config)
    report = init_from(drafter, path, target_head(), vocab(USED_NEW), tokens=tokens, tokens_from="--source-target")
    assert (report.positions_agree, report.tokens_shared, report.rows_copied) == (N, N, N)
    assert torch.equal(drafter.lm_head.weight, src.lm_head.weight)


def test_a_token_map_prefers_the_sources_plain_token_to_its_byte_fallback():
    """A byte-level new target against a sentencepiece source: 'Ġ' (a space) is the source's '▁', the token
    its text is written with, never the byte fallback <0x20> of the same byte (lower id)."""
    from drafter_lab.targets.tokenizer import train_bpe

    src, new = sentencepiece(), train_bpe(TEXTS, 600)
    tokens = token_map(src, new, len(new))
    theirs, mine = src.get_vocab(), new.get_vocab()
    assert theirs["<0x20>"] < theirs["▁"] and tokens[mine["Ġ"]] == theirs["▁"]
    plain = {t.replace("▁", " ").encode() for t in theirs if not t.startswith("<")}
    for b in range(256):  # no new token maps to a byte fallback whose byte the source also spells plainly
        if bytes([b]) in plain:
            assert not (tokens == theirs[f"<0x{b:02X}>"]).any(), b


def test_a_token_map_shorter_than_the_tokenizer_drops_the_ids_past_it():
    """A target with fewer rows than its tokenizer has tokens: ids past the rows are left out, not written."""
    src, new = sentencepiece(), sentencepiece(["<|im_start|>"])
    tokens = token_map(src, new, len(src))
    assert torch.equal(tokens, torch.arange(len(src)))
