"""Pins from the s65 mutation audit of targets/tokenizer.py: the trained tokenizer round-trips any text."""

from __future__ import annotations

from drafter_lab.targets.tokenizer import SPECIAL_TOKENS, train_bpe


def test_bpe_round_trips_unseen_bytes_and_marks_turns():
    tok = train_bpe(["the cat sat on the mat"] * 20, vocab_size=300)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    assert all(tok.convert_tokens_to_ids(s) is not None for s in SPECIAL_TOKENS)
    # bytes never seen in training (accents, CJK, emoji) still encode: the byte alphabet is in the vocab,
    # and no space is invented in front of the text
    text = "Zoë says 你好 🙂\n\tend"
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>" in chat
