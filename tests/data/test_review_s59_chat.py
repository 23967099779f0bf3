"""Loss masks where the generation prompt is not how the template writes earlier turns (DeepSeek-R1's
`<think>\\n`): each turn is placed where the template writes its text, not where that text first
occurs past the turn before (a user turn quoting the answer, "Now say bye" before "bye")."""

from __future__ import annotations

import pytest
from test_data_chat import spans, word_by_word
from test_data_hidden_thinking import R1_MANNER, stops, templated

from drafter_lab.data.chat import encode_conversation

END = "<｜end▁of▁sentence｜>"
CHAT = [{"role": "user", "content": "Reply with exactly: Sure thing"}, {"role": "assistant", "content": "Sure thing"},
        {"role": "user", "content": "Now say bye"}, {"role": "assistant", "content": " bye"}]


@pytest.mark.parametrize("last_only", [False, True])
def test_a_user_turn_holding_the_answer_is_not_trained(random_llama, last_only):
    tok = templated(random_llama, R1_MANNER)
    answers = [m["content"] for m in CHAT if m["role"] == "assistant"][-1 if last_only else 0:]
    ids, mask = encode_conversation(tok, CHAT, 10_000, end_ids=stops(tok), last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + END for a in answers]
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m for m in CHAT]
    ids, mask = encode_conversation(tok, exact, 10_000, True, stops(tok), last_only=last_only)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*word_by_word(tok, a), *stops(tok)] for a in answers]
