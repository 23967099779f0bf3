"""Transfer across tokenizers, review 2: a python (remote-code) byte-level tokenizer, as Kimi K2's."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import _byte_level_alphabet, init_from, token_map
from drafter_lab.targets.tokenizer import train_bpe

from .test_model import random_drafter, small_config

TEXTS = ["Le café est très réputé à côté de l'hôtel, déjà vu. " * 3] * 50 + ["def main(): return x + y\n" * 5] * 50


def tiktoken_like(fast):
    """Kimi K2's TikTokenTokenizer in miniature: a python tokenizer (no tokenizers pipeline) whose
    get_vocab() is its encoder of GPT-2 byte-alphabet strings ('Ġde' for ' de'), beside byte_decoder."""
    from transformers import PreTrainedTokenizer

    class TikTokenLike(PreTrainedTokenizer):
        def __init__(self, encoder, **kw):
            self.encoder = dict(encoder)
            self.decoder = {i: t for t, i in self.encoder.items()}
            self.byte_decoder = _byte_level_alphabet()
            self.byte_encoder = {b: c for c, b in self.byte_decoder.items()}
            super().__init__(**kw)

        @property
        def vocab_size(self):
            return len(self.encoder)

        def get_vocab(self):
            return self.encoder

        def _tokenize(self, text):
            return list(text)

        def _convert_token_to_id(self, token):
            return self.encoder[token]

        def _convert_id_to_token(self, index):
            return self.decoder[index]

        def convert_tokens_to_string(self, tokens):
            return bytes(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    return TikTokenLike(fast.get_vocab(), eos_token="<|im_end|>", additional_special_tokens=list(fast.get_added_vocab()))


@pytest.fixture(scope="module")
def pair():
    """A python byte-level tokenizer (the source's target) and a byte-level BPE trained on text read
    wrongly as Latin-1 ('cafÃ©', as web text holds it), so that it has tokens like 'ÃĥÂ©'."""
    fast = train_bpe(TEXTS, 400)
    mojibake = [t.encode().decode("latin-1") for t in TEXTS]
    return fast, tiktoken_like(fast), train_bpe(mojibake + TEXTS[:10], 400)


def test_a_python_byte_level_tokenizer_pairs_tokens_by_their_bytes(pair):
    """Its 'Ġde' stands for ' de' and its 'Ã©' for 'é' (c3 a9): before, they were read as their own
    UTF-8 ('Ã©' as c3 83 c2 a9), so most tokens were lost and the new 'Ã©' (é) took the source's 'é'
    (the one byte e9)."""
    fast, python, new = pair
    tokens = token_map(python, new, len(new))
    assert torch.equal(tokens, token_map(fast, new, len(new)))  # as the same vocabulary in a fast tokenizer
    theirs, mine = python.get_vocab(), new.get_vocab()
    assert tokens[mine["Ã©"]] == theirs["Ã©"] and tokens[mine["Ġde"]] == theirs["Ġde"]
    for i in (tokens >= 0).nonzero().flatten().tolist():
        a = python.convert_tokens_to_string([python.convert_ids_to_tokens(int(tokens[i]))])
        b = new.convert_tokens_to_string([new.convert_ids_to_tokens(i)])
        assert a == b, (new.convert_ids_to_tokens(i), python.convert_ids_to_tokens(int(tokens[i])))


def test_a_transfer_from_a_python_byte_level_target_keeps_each_tokens_logit(pair, tmp_path):
    """Every draft token both vocabularies hold gets the source's logit for that token."""
    _, python, new = pair
    v_old, v_new = len(python), len(new)
    cfg = small_config(target_vocab_size=v_old, draft_vocab_size=60, target_hidden_size=48)
    src = random_drafter(cfg, seed=3, dtype=torch.float32)
    save_drafter(src, tmp_path / "src")
    used_src = (src.d2t + torch.arange(60)).tolist()
    tokens = token_map(python, new, v_new)
    back = {int(tokens[i]): i for i in range(v_new) if tokens[i] >= 0}
    shared = [back[t] for t in used_src if t in back]
    new_used = sorted(shared + [i for i in range(v_new) if i not in shared][: 60 - len(shared)])
    torch.manual_seed(5)
    drafter = Eagle3Drafter(dataclasses.replace(cfg, target_vocab_size=v_new))
    head = torch.randn(v_new, 48)
    report = init_from(drafter, tmp_path / "src", SimpleNamespace(lm_head_weight=lambda: head),
                       DraftVocab.from_used(torch.tensor(new_used), v_new), tokens=tokens, tokens_from="--source-target")
    assert len(shared) > 40 and report.rows_copied == len(shared) and report.tokens_shared == len(shared)
    h = torch.randn(3, 48)
    mine, theirs = drafter.lm_head(h), src.lm_head(h)
    for t in used_src:
        if t in back:
            assert torch.equal(mine[:, new_used.index(back[t])], theirs[:, used_src.index(t)]), t
