"""Review s72 (h2): chat.py's dropped_calls, served_text and encode_conversation, pinned where mutants lived."""
from __future__ import annotations

import pytest
from test_data_chat import templated

from drafter_lab.data.chat import TemplateRefusal, dropped_calls, encode_conversation, render, served_text

ASK = {"role": "user", "content": "How big is a.txt?"}
CALL = {"type": "function", "function": {"name": "stat", "arguments": {"path": "a.txt"}}}
RESULT = {"role": "tool", "content": "2048"}
# A template that writes a turn's text, else its calls: the calls of a turn with text are lost.
TEXT_OR_CALLS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] or not m['tool_calls'] %}"
    "{{ m['content'] }}{% else %}{% for c in m['tool_calls'] %}<tool_call>{{ c['function'] | tojson }}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_single_call_the_template_leaves_out_is_counted(random_llama):
    """A turn's only call, left out where another turn's is written (so the conversation does not
    render alike without every call), is still a turn whose call the template drops."""
    tok = templated(random_llama, TEXT_OR_CALLS)
    said = {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}
    bare = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    chat = [ASK, said, RESULT, bare, RESULT, {"role": "assistant", "content": "2 KiB."}]
    assert dropped_calls(tok, chat) == (2, 1)
    assert dropped_calls(tok, chat[:2], last_only=True) == (1, 1)
    assert dropped_calls(tok, chat[:4], last_only=True) == (1, 0)
    # No turn making calls (or, `last_only`, not the last): none counted, none dropped.
    assert dropped_calls(tok, [ASK, chat[-1]]) == (0, 0)
    assert dropped_calls(tok, chat, last_only=True) == (0, 0)


R1_MANNER = (  # DeepSeek-R1's manner: an answer's inline thinking cut, the generation prompt opening the block
    "{% for m in messages %}{% if m['role'] == 'user' %}<|User|>{{ m['content'] }}"
    "{% else %}<|Assistant|>{{ m['content'].split('</think>')[-1] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"
)


def test_a_user_turn_last_is_served_as_rendered(random_llama):
    """A conversation ending in a user turn that quotes think tags: no assistant turn of it is the last,
    so no thinking is put back anywhere (the user's text is not an answer's inline thinking)."""
    tok = templated(random_llama, R1_MANNER)
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>Greet.</think>Hello."},
            {"role": "user", "content": "What does <think>x</think> mean?"}]
    assert served_text(tok, chat, frozenset(), None, None) == render(tok, chat)


def test_a_turn_without_an_end_token_is_refused_token_exact(random_llama):
    """Token-exact, a turn with thinking kept apart is spliced up to its end-of-turn token: under a
    template that writes none (plain text turns), the turn cannot be placed, a TemplateRefusal."""
    tok = templated(random_llama, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    turn = {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet.",
            "token_ids": tok("Hello.", add_special_tokens=False)["input_ids"]}
    with pytest.raises(TemplateRefusal, match="chat template rewrites assistant turn 1"):
        encode_conversation(tok, [{"role": "user", "content": "Hi"}, turn], 4096, True)
