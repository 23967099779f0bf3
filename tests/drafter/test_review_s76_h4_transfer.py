"""Mutation audit (review s76, h4) of drafter/transfer.py: the report table's columns, GPT-2's byte alphabet,
a token moved to the source's id 0, an owned embedding remapped by token, a run record without a fingerprint,
the reason a head copied without remap is given, and the row counts its refusal names."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.transfer import TransferReport, _byte_level_alphabet, init_from, source_tokens
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config
from .test_transfer import USED_NEW, USED_SRC, N, V, fresh, source, target_head, vocab


def test_the_table_has_its_three_named_columns_with_values_right_aligned():
    report = TransferReport(source="src", source_format="sglang", remap=True, remap_by="id", draft_vocab_size=4,
                            source_draft_vocab_size=4, positions_agree=1, tokens_shared=2, rows_copied=2,
                            rows_from_target=2)
    columns = report.table().columns
    assert [c.header for c in columns] == ["item", "value", "reason / detail"]
    assert columns[1].justify == "right"


def test_the_byte_alphabet_is_gpt2s_bytes_to_unicode_inverted():
    """Each of the 256 characters a byte-level vocabulary is written in stands for its one byte, and no
    other character is read as a byte."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert _byte_level_alphabet() == {c: b for b, c in bytes_to_unicode().items()}
    assert set(_byte_level_alphabet()) == set(ByteLevel.alphabet())


def test_a_draft_token_that_moved_to_the_sources_id_0_is_counted_as_moved(tmp_path):
    """New id 2 is the source's id 0 (and new id 0 is absent there): 1 moved, 1 absent, and its row is the
    source's row of token 0."""
    src, path = source(tmp_path, formats.SGLANG)
    tokens = torch.arange(V)
    tokens[0], tokens[2] = -1, 0
    drafter = fresh(src.config)
    report = init_from(drafter, path, target_head(), vocab(USED_NEW), tokens=tokens, tokens_from="--source-target")
    assert report.notes == ["the two targets' tokenizers differ (found through --source-target): remapped by token "
                            "string (of the 37 draft tokens, 1 under another id there, 1 absent from it)"]
    assert torch.equal(drafter.lm_head.weight[USED_NEW.index(2)], src.lm_head.weight[USED_SRC.index(0)])


def test_an_owned_embedding_remapped_by_token_says_so_and_takes_each_tokens_row(tmp_path):
    """H != H_target: the drafter's own embedding takes, for each new id, the source's row of the same token;
    the report says it went by token string (not by id), and a token the source lacks keeps its init."""
    cfg = small_config(target_vocab_size=V, draft_vocab_size=N)  # H 48, H_target 40
    src = random_drafter(cfg, seed=23, dtype=torch.float32)
    src.d2t.copy_(vocab(USED_SRC).d2t)
    src.t2d.copy_(vocab(USED_SRC).t2d)
    save_drafter(src, tmp_path / "src")
    tokens = torch.arange(V)
    tokens[5], tokens[9] = 7, -1
    drafter = fresh(cfg)
    before = drafter.embed_tokens.weight.clone()
    report = init_from(drafter, tmp_path / "src", target_head(40), vocab(USED_SRC), tokens=tokens,
                       tokens_from="--source-target")
    reasons = {row["tensor"]: row["reason"] for row in report.loaded}
    assert reasons["embed_tokens.weight"] == (f"rows of the {V - 1} tokens the source's vocabulary has, by token "
                                              "string; the others start fresh")
    assert torch.equal(drafter.embed_tokens.weight[5], src.embed_tokens.weight[7])
    assert torch.equal(drafter.embed_tokens.weight[9], before[9])


def test_a_run_record_without_a_fingerprint_names_no_target_to_remap_by(tmp_path):
    """Without a recorded fingerprint the named target cannot be checked, so its path is not read at all:
    the transfer goes by id, even where that path is malformed."""
    _, path = source(tmp_path, formats.SGLANG)
    (path / "run.json").write_text(json.dumps({"target": {"path": 5}}))
    assert source_tokens(path, None, None) == (None, None)


def test_a_head_copied_without_remap_is_reported_as_loaded_as_is(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    report = init_from(fresh(src.config), path, target_head(), vocab(USED_NEW), remap=False)
    reasons = {row["tensor"]: row["reason"] for row in report.loaded}
    assert reasons["lm_head.weight"] == "rows copied as-is (--no-remap): not re-indexed"


def test_a_no_remap_of_another_draft_vocab_size_names_both_row_counts(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    smaller = dataclasses.replace(src.config, draft_vocab_size=30)
    with pytest.raises(LabError, match=r"the source drafter has 37 draft rows and this run's draft vocab 30: train "
                                       r"with --draft-vocab-size 37, or leave --no-remap out"):
        init_from(fresh(smaller), path, target_head(), vocab(USED_NEW[:30]), remap=False)
