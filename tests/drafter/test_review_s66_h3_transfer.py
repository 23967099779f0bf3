"""Mutation audit (review s66, h3) of drafter/transfer.py: the remap note's counts when a draft token maps
to the source's id 0, the notes a resized target gets with and without a tokenizer, an owned embedding's
reasons, a source without recorded aux layers, a tokenizer-only --source-target, and the vocabularies
token_map reads (a byte-level token outside GPT-2's alphabet, a special_tokens dict holding names)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import check_source_target, init_from, token_map
from drafter_lab.errors import LabError

from .test_model import random_drafter, small_config
from .test_transfer import USED_NEW, USED_SRC, V, fresh, source, target_head, vocab
from .test_transfer_review import _resized


def test_a_token_remap_counts_a_draft_token_at_source_id_0_as_present(tmp_path):
    """New ids 21 and 23 are absent from the source's tokenizer, 25 is its 30; 0 stays 0 (present, not absent)."""
    src, path = source(tmp_path, formats.SGLANG)
    tokens = torch.arange(V)
    tokens[[21, 23]] = -1
    tokens[25] = 30
    target = target_head()
    drafter = fresh(src.config)
    report = init_from(drafter, path, target, vocab(USED_NEW), tokens=tokens, tokens_from="--source-target")
    assert report.notes == ["the two targets' tokenizers differ (found through --source-target): remapped by token "
                            "string (of the 37 draft tokens, 1 under another id there, 2 absent from it)"]
    assert (report.rows_copied, report.rows_from_target, report.tokens_shared, report.positions_agree) == (18, 19, 18, 10)
    row = {tok: i for i, tok in enumerate(USED_NEW)}
    assert torch.equal(drafter.lm_head.weight[row[25]], src.lm_head.weight[USED_SRC.index(30)])
    for tok in (21, 23):  # the target's row of the new id, not of the -1 that stands for "none"
        assert torch.equal(drafter.lm_head.weight[row[tok]], target.lm_head_weight()[tok])


@pytest.mark.parametrize("own_embedding", [False, True])
def test_a_resized_target_without_a_tokenizer_at_hand_is_noted_and_keeps_rows_by_id(tmp_path, own_embedding):
    """101 -> 111 tokens, no tokenizer of the source's target found: the report says ids are taken as the
    same tokens; an embedding the drafter owns (of another row count) starts fresh, said why."""
    src, drafter, before, report = _resized(tmp_path, own_embedding)
    assert report.notes == ["the source's target has 101 tokens, this one 111, and no tokenizer of the source's "
                            "target is at hand: ids are taken to name the same tokens (pass --source-target to "
                            "remap by token)"]
    assert report.rows_copied == 10 and torch.equal(drafter.lm_head.weight, src.lm_head.weight)
    skipped = {row["tensor"]: row["reason"] for row in report.skipped}
    if own_embedding:
        assert skipped["embed_tokens.weight"] == ("shape (101, 40), this drafter's own embedding is (111, 40): "
                                                  "it starts fresh")
        assert torch.equal(drafter.embed_tokens.weight, before)
    else:
        assert skipped["embed_tokens.weight"] == "token embedding is the new target's own (frozen)"


def test_an_owned_embedding_kept_by_id_says_so(tmp_path):
    """The same tokenizer over a larger vocab (found): the embedding's reason says its rows came by id."""
    cfg = small_config(target_vocab_size=101, draft_vocab_size=10, hidden_size=40, target_hidden_size=48)
    src = random_drafter(cfg, seed=4, dtype=torch.float32)
    save_drafter(src, tmp_path / "src")
    drafter = Eagle3Drafter(dataclasses.replace(cfg, target_vocab_size=111))
    report = init_from(drafter, tmp_path / "src", SimpleNamespace(lm_head_weight=lambda: torch.randn(111, 40)),
                       DraftVocab.from_used(src.d2t + torch.arange(10), 111), tokens_from="--source-target")
    loaded = {row["tensor"]: row["reason"] for row in report.loaded}
    assert loaded["embed_tokens.weight"] == ("rows of the 101 tokens the source's vocabulary has, by id (the same "
                                             "tokenizer); the others start fresh")


def test_a_source_without_recorded_aux_layers_gets_no_aux_note(tmp_path):
    """A config without aux ids (the engine's default layers) says nothing about which the source read."""
    src, path = source(tmp_path, formats.SGLANG, aux_layer_ids=[])
    report = init_from(fresh(dataclasses.replace(src.config, aux_layer_ids=[1, 3, 5])), path, target_head(),
                       vocab(USED_NEW))
    assert report.notes == []


def test_a_tokenizer_only_source_target_cannot_be_checked_and_is_taken(tmp_path):
    """--source-target of a tokenizer without weights: nothing to fingerprint, so not refused."""
    _, path = source(tmp_path, formats.SGLANG)
    (path / "run.json").write_text(json.dumps({"target": {"fingerprint": "sha256:recorded"}}))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tok / "tokenizer.json").write_text("{}")
    assert check_source_target(path, tok) is None


def _byte_level(vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_a_byte_level_token_outside_the_byte_alphabet_pairs_by_its_own_text():
    """'中' is no GPT-2 byte character: it stands for its UTF-8 bytes, not a lookup that fails."""
    src = _byte_level({"a": 0, "Ġa": 1, "中": 2})
    new = _byte_level({"中": 0, "a": 1, "Ġa": 2})
    assert token_map(src, new, 3).tolist() == [2, 0, 1]


def test_a_special_tokens_dict_holding_names_is_not_read_as_tokens():
    """Only {token: id} entries of a python tokenizer's special_tokens are tokens kept apart."""
    def tokenizer(vocab):
        return SimpleNamespace(get_vocab=lambda: dict(vocab), get_added_vocab=dict,
                               special_tokens={"<|end|>": 2, "eos_token": "<|end|>"})

    assert token_map(tokenizer({"a": 0, "b": 1}), tokenizer({"b": 0, "a": 1}), 3).tolist() == [1, 0, 2]


def _table_lines(report) -> list[str]:
    from rich.console import Console

    console = Console(record=True, width=250)
    console.print(report.table())
    return [" ".join(line.replace("│", " ").split()) for line in console.export_text().splitlines()]


def test_the_table_says_the_remap_the_row_counts_and_the_notes(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    other_aux = dataclasses.replace(src.config, aux_layer_ids=[1, 3, 5])
    lines = _table_lines(init_from(fresh(other_aux), path, target_head(), vocab(USED_NEW), remap=False))
    assert any(f"transfer from {path} (sglang, remap off)" in line for line in lines)
    assert "lm_head rows copied 37 from the source" in lines
    assert "lm_head rows from target 0 target's own lm_head row" in lines
    assert "note source fc was trained on aux layers [2, 4, 5]; the new drafter reads [1, 3, 5]" in lines
    lines = _table_lines(init_from(fresh(src.config), path, target_head(), vocab(USED_NEW)))
    assert any("(sglang, remap on, by id)" in line for line in lines)
    assert "lm_head rows copied 17 from the source" in lines and "lm_head rows from target 20 target's own lm_head row" in lines


def test_the_same_tokenizer_over_the_same_vocab_size_gets_no_note(tmp_path):
    """Found (token_map gave None) and no size changed: nothing to say."""
    src, path = source(tmp_path, formats.SGLANG)
    report = init_from(fresh(src.config), path, target_head(), vocab(USED_NEW), tokens_from="--source-target")
    assert report.notes == [] and report.remap_by == "id"


def test_a_found_token_map_takes_each_new_id_to_the_sources(random_llama, tmp_path):
    """source_tokens maps the new target's ids to the source target's (not the other way), found through
    --source-target (no run record: nothing to check it against) or through the run record."""
    import shutil

    from drafter_lab.drafter.transfer import source_tokens
    from drafter_lab.targets.corpus import source_files
    from drafter_lab.targets.fingerprint import fingerprint
    from drafter_lab.targets.hf import load_target_head, load_tokenizer
    from drafter_lab.targets.tokenizer import train_bpe

    _, path = source(tmp_path, formats.SGLANG)
    new = tmp_path / "next-version"
    shutil.copytree(random_llama, new)
    train_bpe([f.data.decode() for f in source_files(max_files=8)], 400).save_pretrained(new)
    target = load_target_head(new)
    theirs, mine = load_tokenizer(random_llama).get_vocab(), load_tokenizer(new).get_vocab()
    want = torch.full((target.vocab_size,), -1)
    for token, i in mine.items():
        want[i] = theirs.get(token, -1)
    assert (want[:len(mine)] != torch.arange(len(mine))).sum() > 10  # ids that moved: a swapped map would show
    tokens, found = source_tokens(path, random_llama, target)
    assert found == "--source-target" and torch.equal(tokens, want)
    (path / "run.json").write_text(json.dumps({"target": {"path": str(random_llama),
                                                          "fingerprint": fingerprint(random_llama)}}))
    tokens, found = source_tokens(path, None, target)
    assert found == f"the target its run.json names, {random_llama}" and torch.equal(tokens, want)


def test_a_source_tensor_of_another_shape_names_the_sources_weights_file(tmp_path):
    src, path = source(tmp_path, formats.SGLANG, intermediate_size=64)
    with pytest.raises(LabError) as e:
        init_from(fresh(dataclasses.replace(src.config, intermediate_size=80)), path, target_head(), vocab(USED_NEW))
    assert str(e.value) == (f"{path / 'model.safetensors'}: tensor 'midlayer.mlp.down_proj.weight' has shape "
                            "(48, 64), the drafter needs (48, 80)")


def test_a_headless_source_beside_a_target_head_of_another_width_names_its_weights_file(tmp_path):
    cfg = small_config(target_vocab_size=V, draft_vocab_size=V, target_hidden_size=48)
    src = random_drafter(cfg, seed=22, dtype=torch.float32)
    src.d2t.zero_()
    src.t2d.fill_(True)
    path = save_drafter(src, tmp_path / "src", head=False)
    with pytest.raises(LabError) as e:
        init_from(fresh(dataclasses.replace(cfg, draft_vocab_size=37)), path, target_head(40), vocab(USED_NEW))
    assert str(e.value) == (f"{path / 'model.safetensors'}: 37 lm_head rows need the target's lm_head, but it has "
                            "width 40 and the drafter hidden size is 48 (H != H_target): cannot fill them")


def test_a_source_of_another_residual_names_its_config_for_draft_config(tmp_path):
    """The refusal's --draft-config is the source's config.json, to be pasted as it is."""
    src, path = source(tmp_path, formats.SPECULATORS, norm_before_residual=True)
    with pytest.raises(LabError) as e:
        init_from(fresh(dataclasses.replace(src.config, norm_before_residual=False)), path, target_head(), vocab(USED_NEW))
    assert str(e.value) == (f"{path}: the source drafter has norm_before_residual=true, this one false: its weights "
                            f"work with its own residual (train with --draft-config {path / 'config.json'}, or "
                            "--drafter-norm-before-residual true)")
