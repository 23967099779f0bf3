"""Transfer across tokenizers: byte-fallback duplicates, and a new target of the same tokenizer but
another vocab size."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.data.vocab import DraftVocab, compare_vocabs
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import init_from, token_map
from drafter_lab.targets.corpus import source_files

from .test_model import random_drafter, small_config

TEXTS = ["Le café est très réputé à côté de l'hôtel. A, B; C. (x) [y] {z} " * 3] * 50
TEXTS += [f.data.decode() for f in source_files(max_files=8)]
SINGLE = ["A", ",", ";", ".", "(", ")", "e", "x"]  # one byte each: the sentencepiece vocab also has <0xNN>


def sentencepiece(added=()):
    """A Llama-2-style vocabulary: '▁' for a space, <0xNN> byte fallback at low ids."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    sp.normalizer = normalizers.Replace(" ", "▁")
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    sp.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tok.add_tokens(list(added))
    return tok


@pytest.fixture(scope="module")
def sp_pair():
    """A sentencepiece target's tokenizer, and its next version's: the same, one token appended."""
    return sentencepiece(), sentencepiece(["<|im_start|>"])


def test_a_token_map_keeps_a_sentencepiece_id_that_did_not_move(sp_pair):
    """'A' and its byte fallback <0x41> stand for the same byte: 'A' is still 'A' (the token the text is
    written with and a drafter's vocab holds), not the lower-id <0x41>."""
    old, new = sp_pair
    tokens = token_map(old, new, len(new))
    v = old.get_vocab()
    assert v["<0x41>"] < v["A"] and tokens[v["A"]] == v["A"]
    assert torch.equal(tokens[: len(old)], torch.arange(len(old)))  # appending a token moves no id
    assert tokens[len(old)] == -1


def test_a_remap_from_a_sentencepiece_source_keeps_its_single_byte_rows(sp_pair, tmp_path):
    old, new = sp_pair
    v_old, v_new = len(old), len(new)
    ids = sorted(old.convert_tokens_to_ids(SINGLE) + list(range(300, 320)))
    cfg = small_config(target_vocab_size=v_old, draft_vocab_size=len(ids), target_hidden_size=48)
    src = random_drafter(cfg, seed=3, dtype=torch.float32)
    vocab = DraftVocab.from_used(torch.tensor(ids), v_old)
    src.d2t.copy_(vocab.d2t)
    src.t2d.copy_(vocab.t2d)
    save_drafter(src, tmp_path / "src")
    new_ids = sorted(new.convert_tokens_to_ids(SINGLE) + list(range(300, 320)))
    new_vocab = DraftVocab.from_used(torch.tensor(new_ids), v_new)
    torch.manual_seed(5)
    drafter = Eagle3Drafter(dataclasses.replace(cfg, target_vocab_size=v_new))
    head = torch.randn(v_new, 48)
    tokens = token_map(old, new, v_new)
    report = init_from(drafter, tmp_path / "src", SimpleNamespace(lm_head_weight=lambda: head), new_vocab,
                       tokens=tokens, tokens_from="--source-target")
    assert (report.rows_copied, report.rows_from_target, report.positions_agree) == (len(ids), 0, len(ids))
    assert torch.equal(drafter.lm_head.weight, src.lm_head.weight)
    assert "0 under another id there, 0 absent" in report.notes[0]


def test_compare_by_token_finds_a_byte_level_token_in_a_sentencepiece_vocab(sp_pair):
    """The probe's vocab agreement, a byte-level source against a sentencepiece new target: b's 'A' and
    <0x41> are both a's 'A'; b's vocab holds 'A', so a's 'A' is shared."""
    from drafter_lab.targets.tokenizer import train_bpe

    a_tok, (_, b_tok) = train_bpe(TEXTS, 600), sp_pair
    b_to_a = token_map(a_tok, b_tok, len(b_tok))
    a = DraftVocab.from_used(torch.tensor(a_tok.convert_tokens_to_ids(SINGLE)), len(a_tok))
    b = DraftVocab.from_used(torch.tensor(b_tok.convert_tokens_to_ids(SINGLE)), len(b_tok))
    r = compare_vocabs(a, b, b_to_a=b_to_a)
    assert (r["shared_tokens"], r["only_a_count"], r["only_b_count"]) == (len(SINGLE), 0, 0)


def _resized(tmp_path, own_embedding: bool, **tokens):
    """A source drafter over 101 tokens transferred to a new one over 111 (with `tokens`, init_from's token
    map and where it came from): (source, new drafter, its embedding before, the report)."""
    over = {"hidden_size": 40} if own_embedding else {}  # H != H_target 48: the drafter owns its embedding
    cfg = small_config(target_vocab_size=101, draft_vocab_size=10, target_hidden_size=48, **over)
    src = random_drafter(cfg, seed=4, dtype=torch.float32)
    save_drafter(src, tmp_path / "src")
    used = src.d2t + torch.arange(10)
    torch.manual_seed(5)
    drafter = Eagle3Drafter(dataclasses.replace(cfg, target_vocab_size=111))
    before = drafter.embed_tokens.weight.detach().clone()
    head = torch.randn(111, 48)
    report = init_from(drafter, tmp_path / "src", SimpleNamespace(lm_head_weight=lambda: head),
                       DraftVocab.from_used(used, 111), **tokens)
    return src, drafter, before, report


@pytest.mark.parametrize("own_embedding", [False, True])
def test_the_same_tokenizer_over_a_larger_vocab_keeps_rows_by_id(tmp_path, own_embedding):
    """The new target pads its vocab (101 -> 111 rows), its tokenizer the same as the source's (found, so
    token_map gave None): the report says so, not that no tokenizer is at hand, and an embedding the
    drafter owns keeps the source's rows by id, as the head does."""
    src, drafter, before, report = _resized(tmp_path, own_embedding, tokens=None, tokens_from="--source-target")
    assert report.rows_copied == 10 and torch.equal(drafter.lm_head.weight, src.lm_head.weight)
    assert report.notes == ["the source's target has 101 tokens, this one 111, with the same tokenizer (found "
                            "through --source-target): ids name the same tokens"]
    if own_embedding:
        assert torch.equal(drafter.embed_tokens.weight[:101], src.embed_tokens.weight)
        assert torch.equal(drafter.embed_tokens.weight[101:], before[101:])
        assert "embed_tokens.weight" in report.transferred


def test_a_bf16_source_transfers_by_token_into_the_drafters_dtype(tmp_path):
    """A bf16 checkpoint (as SpecForge saves): each row arrives exactly, in the new drafter's dtype."""
    cfg = small_config(target_vocab_size=101, draft_vocab_size=10, hidden_size=40, target_hidden_size=48)
    src = random_drafter(cfg, seed=6, dtype=torch.bfloat16)
    save_drafter(src, tmp_path / "src")
    used = src.d2t + torch.arange(10)
    tokens = torch.arange(101).roll(1)  # new id t is the source's t - 1
    drafter = Eagle3Drafter(cfg)
    head = torch.randn(101, 40)
    init_from(drafter, tmp_path / "src", SimpleNamespace(lm_head_weight=lambda: head),
              DraftVocab.from_used((used + 1) % 101, 101), tokens=tokens, tokens_from="--source-target")
    assert drafter.lm_head.weight.dtype == torch.float32
    order = torch.argsort((used + 1) % 101)  # the new draft ids, sorted by new target id
    assert torch.equal(drafter.lm_head.weight, src.lm_head.weight[order].float())
    assert torch.equal(drafter.embed_tokens.weight, src.embed_tokens.weight.float()[tokens])
    assert torch.equal(drafter.d2t + torch.arange(10), torch.sort((used + 1) % 101).values)
    assert torch.equal(torch.nonzero(drafter.t2d).flatten(), drafter.d2t + torch.arange(10))
