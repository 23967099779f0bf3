"""Chat template and loss mask behaviours of chat.py that no other test pinned (found by a mutation
audit): each test here failed under a mutant of chat.py that the rest of the suite let pass."""

from __future__ import annotations

from test_data_chat import ANSWERS, MESSAGES, OPEN_LAST, spans
from test_data_reasoning import THINKING

from drafter_lab.data.chat import dropped_reasoning, encode_conversation, render
from drafter_lab.targets.hf import load_tokenizer


def test_an_end_id_past_the_tokenizer_is_no_end_token(random_llama):
    """A target's stop ids may hold one past its tokenizer (a padded vocabulary: no token text): it is
    passed over, not compared as text, where a turn's own render ends on no stop token (a template
    that closes a message only once another follows)."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = OPEN_LAST
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids, mask = encode_conversation(tok, MESSAGES[:-1], max_length=10_000, end_ids=frozenset({end, len(tok) + 7}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + "<|im_end|>" for a in ANSWERS]


def test_inline_thinking_is_read_without_its_opening_tag(random_llama):
    """An answer's inline thinking (`<think>Short.</think>...`) is what lies between the tags: Qwen3's
    template writes it back on lines of its own, so read with its `<think>` it was not found in the
    render and counted as left out."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = THINKING
    chat = [{"role": "user", "content": "What does join do?"},
            {"role": "assistant", "content": "<think>Short.</think>It joins."}]
    assert "<think>\nShort.\n</think>" in render(tok, chat)
    assert dropped_reasoning(tok, chat) == (1, 0)
