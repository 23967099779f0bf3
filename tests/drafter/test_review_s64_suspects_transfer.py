"""Review s64 suspect: ChatGLM2/3's python tokenizer keeps its sentencepiece model one level down."""

from __future__ import annotations

import torch

from drafter_lab.drafter.transfer import _vocab_kind, token_map

from .test_review_s64_transfer import python_sentencepiece
from .test_transfer_review import sentencepiece


def chatglm_like(fast):
    """ChatGLM2/3's remote-code tokenizer in miniature: a PreTrainedTokenizer whose get_vocab() is
    `self.tokenizer` (an SPTokenizer)'s IdToPiece, the sentencepiece processor held as
    `self.tokenizer.sp_model`, none on the tokenizer itself."""
    python = python_sentencepiece(fast)
    python.tokenizer = type("SPTokenizer", (), {"sp_model": python.__dict__.pop("sp_model")})()
    return python


def test_a_chatglm_tokenizer_reads_its_pieces_as_sentencepiece():
    """Read as plain text, its '▁de' stood for '▁de' and its <0x41> for those six characters: every
    word-initial token of a fast sentencepiece target lost its row (as the python one did before)."""
    fast, new = sentencepiece(), sentencepiece(["<|im_start|>"])
    glm = chatglm_like(fast)
    assert getattr(glm, "sp_model", None) is None and _vocab_kind(glm) == "metaspace"
    tokens = token_map(glm, new, len(new))
    assert torch.equal(tokens, token_map(fast, new, len(new)))
    assert torch.equal(tokens[: len(fast)], torch.arange(len(fast)))
