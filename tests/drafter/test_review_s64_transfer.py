"""Mutation audit (review s64) of drafter.transfer: a new vocab of another size than the drafter's, the
report's notes and table, an owned embedding of another width, a target recorded by its legacy
fingerprint, and how a tokenizer's vocabulary kind and its special tokens are read."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from rich.console import Console

from drafter_lab.drafter import formats
from drafter_lab.drafter.transfer import (
    _byte_level_alphabet,
    _vocab_kind,
    init_from,
    source_tokens,
    token_map,
)
from drafter_lab.errors import LabError

from .test_transfer import USED_NEW, V, fresh, source, target_head, vocab
from .test_transfer_review import TEXTS, sentencepiece
from .test_transfer_review2 import tiktoken_like


def test_a_new_vocab_of_another_size_than_the_drafters_is_refused(tmp_path):
    """Else its lm_head rows and d2t would be copied into buffers of another length (a torch error)."""
    src, path = source(tmp_path, formats.SGLANG)
    with pytest.raises(LabError, match="^new vocab has 30 entries, the drafter 37$"):
        init_from(fresh(src.config), path, target_head(), vocab(USED_NEW[:30]))


def test_a_source_trained_on_other_aux_layers_is_noted(tmp_path):
    src, path = source(tmp_path, formats.SGLANG)
    report = init_from(fresh(dataclasses.replace(src.config, aux_layer_ids=[1, 3, 5])), path, target_head(),
                       vocab(USED_NEW))
    assert report.notes == ["source fc was trained on aux layers [2, 4, 5]; the new drafter reads [1, 3, 5]"]


def test_the_table_counts_agreeing_positions_out_of_the_positions_both_have(tmp_path):
    """A larger new draft vocab (40 against the source's 37): 10 of the 37 positions both have agree."""
    src, path = source(tmp_path, formats.SGLANG)
    report = init_from(fresh(dataclasses.replace(src.config, draft_vocab_size=40)), path, target_head(),
                       vocab([*USED_NEW, 94, 96, 98]))
    console = Console(record=True, width=200)
    console.print(report.table())
    rows = [line for line in console.export_text().splitlines() if "positions that already agree" in line]
    assert len(rows) == 1 and " 10 / 37 " in rows[0]


def test_an_owned_embedding_of_another_width_is_not_copied_row_by_row(tmp_path):
    """A source 40 wide into a drafter 32 wide, both owning their embedding, remapped by token: the
    embedding is passed over as another shape, and the refusal names fc.weight, not a torch shape error."""
    src, path = source(tmp_path, formats.SGLANG, hidden_size=40)
    tokens = torch.arange(V).roll(3)
    with pytest.raises(LabError, match=r"tensor 'fc.weight' has shape \(40, 144\), the drafter needs \(32, 144\)"):
        init_from(fresh(dataclasses.replace(src.config, hidden_size=32)), path, target_head(32), vocab(USED_NEW),
                  tokens=tokens, tokens_from="--source-target")


def test_a_target_recorded_by_its_legacy_fingerprint_is_found_and_accepted(random_llama, tmp_path):
    """Labs before recorded the leading/trailing-MiB name: the target it names is still the source's (found,
    and a --source-target of it is not refused)."""
    from drafter_lab.targets.fingerprint import legacy_fingerprint
    from drafter_lab.targets.hf import load_target_head

    _, path = source(tmp_path, formats.SGLANG)
    (path / "run.json").write_text(json.dumps({"target": {"path": str(random_llama),
                                                          "fingerprint": legacy_fingerprint(random_llama)}}))
    target = load_target_head(random_llama)
    assert source_tokens(path, None, target) == (None, f"the target its run.json names, {random_llama}")
    assert source_tokens(path, random_llama, target) == (None, "--source-target")


def _fast(pre=None, decoder=None, byte_fallback=False):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab={"a": 0, "▁a": 1}, merges=[], byte_fallback=byte_fallback))
    if pre is not None:
        tok.pre_tokenizer = pre
    if decoder is not None:
        tok.decoder = decoder
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _kinds():
    from tokenizers import decoders, pre_tokenizers

    split = pre_tokenizers.Split(r"\d", behavior="isolated")
    sp_decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return [
        # Llama-3, Qwen-2: ByteLevel inside a Sequence of pre-tokenizers
        (lambda: _fast(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False)])), "byte_level"),
        # Llama-2's layout (no pre-tokenizer), the byte fallback said only by its decoder's Sequence ...
        (lambda: _fast(decoder=sp_decoder), "metaspace"),
        # ... or only by its model
        (lambda: _fast(byte_fallback=True), "metaspace"),
        (lambda: _fast(pre_tokenizers.Whitespace()), None),
    ]


@pytest.mark.parametrize("make, kind", _kinds())
def test_a_vocabulary_kind_is_read_from_nested_components_and_the_model(make, kind):
    assert _vocab_kind(make()) == kind


def test_a_python_tokenizer_with_a_byte_decoder_of_its_own_is_not_byte_level():
    """Only GPT-2's byte alphabet says byte-level: a byte_decoder of another mapping reads tokens as text."""
    python = tiktoken_like(sentencepiece())
    assert _vocab_kind(python) == "byte_level"
    python.byte_decoder = {chr(b): b for b in range(256)}
    assert _vocab_kind(python) is None


def test_a_special_token_pairs_by_its_content_across_tokenizer_families():
    """DeepSeek's <｜end▁of▁sentence｜> in a byte-level source and a sentencepiece new target: the same
    special token, though read as ordinary text the '▁' would stand for a space on one side only."""
    from drafter_lab.targets.tokenizer import train_bpe

    special = ["<｜end▁of▁sentence｜>", "<|café|>"]
    src, new = train_bpe(TEXTS, 600), sentencepiece()
    src.add_tokens(special, special_tokens=True)
    new.add_tokens(special, special_tokens=True)
    tokens = token_map(src, new, len(new))
    for s in special:
        assert tokens[new.get_vocab()[s]] == src.get_vocab()[s], s


def test_a_byte_level_token_spelled_like_a_byte_fallback_is_its_own_text():
    """'<0x41>' in a byte-level vocabulary is those six characters: a sentencepiece source's <0x41> (the
    byte 'A') is no token of it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(_byte_level_alphabet())
    tok = Tokenizer(models.BPE(vocab={**{c: i for i, c in enumerate(alphabet)}, "<0x41>": 256}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    new = PreTrainedTokenizerFast(tokenizer_object=tok)
    src = sentencepiece()
    tokens = token_map(src, new, len(new))
    assert tokens[256] == -1 and tokens[alphabet.index("A")] == src.get_vocab()["A"]


def python_sentencepiece(fast):
    """A slow (python) sentencepiece tokenizer in miniature, as transformers' LlamaTokenizer or Baichuan's
    remote code: get_vocab() is the model's pieces ('▁de', '<0x41>'), held by an `sp_model`, with no
    tokenizers pipeline and no byte_decoder."""
    from transformers import PreTrainedTokenizer

    class PythonSentencePiece(PreTrainedTokenizer):
        def __init__(self, pieces, **kw):
            self.sp_model = object()  # stands for the sentencepiece processor (not installed here)
            self.pieces = dict(pieces)
            self.ids = {i: t for t, i in self.pieces.items()}
            super().__init__(**kw)

        @property
        def vocab_size(self):
            return len(self.pieces)

        def get_vocab(self):
            return dict(self.pieces)

        def _tokenize(self, text):
            return list(text)

        def _convert_token_to_id(self, token):
            return self.pieces[token]

        def _convert_id_to_token(self, index):
            return self.ids[index]

    return PythonSentencePiece(fast.get_vocab(), unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_a_python_sentencepiece_source_pairs_its_pieces_as_the_fast_one_does():
    """Its '▁de' is ' de' and its <0x41> the byte 'A': before, read as their own text, every word-initial
    token of the next version (one token appended, no id moved) lost its row, and each byte fallback took
    the plain token of its byte."""
    fast, new = sentencepiece(), sentencepiece(["<|im_start|>"])
    assert _vocab_kind(python_sentencepiece(fast)) == "metaspace"
    tokens = token_map(python_sentencepiece(fast), new, len(new))
    assert torch.equal(tokens, token_map(fast, new, len(new)))
    assert torch.equal(tokens[: len(fast)], torch.arange(len(fast)))
