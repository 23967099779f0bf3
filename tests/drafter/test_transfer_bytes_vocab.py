"""Transfer across a tokenizer whose get_vocab() is keyed by bytes (Qwen-1's tiktoken QWenTokenizer)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter.transfer import _byte_level_alphabet, token_map
from drafter_lab.targets.tokenizer import train_bpe

from .test_transfer_review2 import TEXTS


def qwen_like(fast):
    """QWenTokenizer in miniature: get_vocab() is its tiktoken mergeable ranks ({b' de': 409, ...}),
    special tokens kept apart in `special_tokens` (never added: its _add_tokens adds nothing)."""
    from transformers import PreTrainedTokenizer

    class QWenLike(PreTrainedTokenizer):
        def __init__(self, ranks, special, **kw):
            self.mergeable_ranks, self.special_tokens = dict(ranks), dict(special)
            self.decoder = {i: t for t, i in [*ranks.items(), *special.items()]}
            super().__init__(**kw)

        @property
        def vocab_size(self):
            return len(self.decoder)

        def get_vocab(self):
            return self.mergeable_ranks

        def _add_tokens(self, new_tokens, special_tokens=False):
            return 0

        def _tokenize(self, text):
            return [bytes([b]) for b in text.encode()]

        def _convert_token_to_id(self, token):
            return self.special_tokens.get(token, self.mergeable_ranks.get(token))

        def _convert_id_to_token(self, index):
            return self.decoder[index]

        def convert_tokens_to_string(self, tokens):
            return b"".join(t if isinstance(t, bytes) else t.encode() for t in tokens).decode("utf-8", "replace")

    alphabet, added = _byte_level_alphabet(), fast.get_added_vocab()
    ranks = {bytes(alphabet[c] for c in t): i for t, i in fast.get_vocab().items() if t not in added}
    return QWenLike(ranks, added)


@pytest.fixture(scope="module")
def vocabs():
    """Two byte-level BPEs over different text (so the same bytes sit under other ids), and each as a
    bytes-keyed tokenizer."""
    a = train_bpe(TEXTS, 400)
    b = train_bpe([t.upper() for t in TEXTS[:40]] + TEXTS[30:], 380)
    return a, b, qwen_like(a), qwen_like(b)


def text(tokenizer, i):
    return tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)])


def assert_pairs_by_bytes(src, new, tokens, at_least):
    paired = (tokens >= 0).nonzero().flatten().tolist()
    assert len(paired) >= at_least
    for i in paired:
        assert text(src, int(tokens[i])) == text(new, i), (new.convert_ids_to_tokens(i), int(tokens[i]))


def test_the_same_bytes_keyed_vocabulary_maps_to_none(vocabs):
    _, _, qa, _ = vocabs
    assert token_map(qa, qwen_like(vocabs[0]), qa.vocab_size) is None


def test_two_bytes_keyed_vocabularies_pair_tokens_by_their_bytes(vocabs):
    """Before, b' de'.encode() raised AttributeError (a str method), so the transfer crashed."""
    _, _, qa, qb = vocabs
    tokens = token_map(qa, qb, qb.vocab_size)
    theirs, mine = qa.get_vocab(), qb.get_vocab()
    assert theirs[b" de"] != mine[b" de"] and tokens[mine[b" de"]] == theirs[b" de"]
    shared = set(theirs) & set(mine)
    assert_pairs_by_bytes(qa, qb, tokens, len(shared))
    assert int((tokens >= 0).sum()) == len(shared) + len(qb.special_tokens)  # and each special token


def ordinary(tokenizer):
    added = tokenizer.get_added_vocab()
    return sorted(i for t, i in tokenizer.get_vocab().items() if t not in added)


def test_a_bytes_keyed_source_pairs_a_byte_level_vocabulary_by_bytes(vocabs):
    """The fast tokenizer's 'Ġde' is b' de', its 'Ã©' b'\\xc3\\xa9' (é): as if the source were fast too."""
    a, b, qa, _ = vocabs
    tokens = token_map(qa, b, len(b))
    for spelled, raw in (("Ġde", b" de"), ("Ã©", "é".encode())):
        assert tokens[b.get_vocab()[spelled]] == qa.get_vocab()[raw]
    ids = ordinary(b)
    assert torch.equal(tokens[ids], token_map(a, b, len(b))[ids])
    assert_pairs_by_bytes(qa, b, tokens, 200)


def test_a_byte_level_source_pairs_a_bytes_keyed_vocabulary_by_bytes(vocabs):
    a, b, _, qb = vocabs
    tokens = token_map(a, qb, len(b))
    for spelled, raw in (("Ġde", b" de"), ("Ã©", "é".encode())):
        assert tokens[qb.get_vocab()[raw]] == a.get_vocab()[spelled]
    ids = ordinary(b)
    assert torch.equal(tokens[ids], token_map(a, b, len(b))[ids])
    assert_pairs_by_bytes(a, qb, tokens, 200)


def test_special_tokens_kept_apart_pair_by_their_content(vocabs):
    """Qwen-1 keeps <|im_end|> out of get_vocab() and get_added_vocab(): the new target's <|im_end|>
    (the end of every assistant turn, so in any draft vocab) mapped to -1 and took the target's row."""
    a, b, qa, qb = vocabs
    for src, new in ((qa, b), (a, qb), (qa, qb)):
        tokens = token_map(src, new, len(b))
        for special in ("<|im_end|>", "<|im_start|>", "<|endoftext|>"):
            assert tokens[b.get_added_vocab()[special]] == a.get_added_vocab()[special], (special, type(src), type(new))
