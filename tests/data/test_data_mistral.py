"""Mistral's chat templates: no generation prompt (the answer follows `[/INST]`), the end-of-turn token
written by the template after each answer, calls as `[TOOL_CALLS]name[ARGS]arguments` control tokens,
results in `[TOOL_RESULTS]`. The V7-Tekken manner lists the system prompt and the tools up front; the
V3 manner writes them into the last user turn, so a render is no prefix of a longer one's: the masks
still land on each answer and its end token, under every `--turns`, and token-exact."""

from __future__ import annotations

import json

import pytest
import torch
from test_data_chat import spans

from drafter_lab.data.capture import sequences_of
from drafter_lab.data.chat import dropped_calls, encode_conversation, render
from drafter_lab.data.conversations import Conversation
from drafter_lab.targets.hf import load_tokenizer

CONTROL = ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]",
           "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"]
ASSISTANT = (
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{% for c in m['tool_calls'] or [] %}"
    "[TOOL_CALLS]{{ c['function']['name'] }}[ARGS]{{ c['function']['arguments'] }}{% endfor %}{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]{% endif %}{% endfor %}"
)
TEKKEN = (  # Mistral-Small-3.x, Devstral: system prompt and tools up front
    "{% set rest = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% if rest is not sameas messages %}[SYSTEM_PROMPT]{{ messages[0]['content'] }}[/SYSTEM_PROMPT]{% endif %}"
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in rest %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]" + ASSISTANT
)
V3 = (  # Mistral-7B-Instruct-v0.3, Mixtral-8x22B: both in the last user turn, wherever that is now
    "{% set rest = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% set ns = namespace(last=-1) %}{% for m in rest %}{% if m['role'] == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for m in rest %}{% if m['role'] == 'user' %}{% if loop.index0 == ns.last and tools %}"
    "[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]"
    "{% if loop.index0 == ns.last and rest is not sameas messages %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "{{ m['content'] }}[/INST]" + ASSISTANT
)
TOOLS = [{"type": "function", "function": {"name": "stat", "parameters": {"type": "object"}}}]
CALL = '[TOOL_CALLS]stat[ARGS]{"path": "setup.py"}'
ANSWERS = ["It is 2 KB.", "You're welcome."]
CHAT = [{"role": "system", "content": "You read files."}, {"role": "user", "content": "How big is setup.py?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "stat", "arguments": json.dumps({"path": "setup.py"})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2048"}, {"role": "assistant", "content": ANSWERS[0]},
        {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": ANSWERS[1]}]


@pytest.fixture(params=["tekken", "v3"])
def mistral(request, random_llama):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": CONTROL})
    tok.chat_template = {"tekken": TEKKEN, "v3": V3}[request.param]
    return tok


def masked(tok, messages, **kw) -> list[str]:
    ids, mask = encode_conversation(tok, messages, 10_000, end_ids=frozenset({tok.eos_token_id}), tools=TOOLS, **kw)
    return [tok.decode(ids[a:b]) for a, b in spans(mask)]


def test_each_answer_and_call_trains_with_its_end_token(mistral):
    end = mistral.eos_token
    text = render(mistral, CHAT, tools=TOOLS)
    assert text.startswith(render(mistral, CHAT[:5], tools=TOOLS)) == (mistral.chat_template == TEKKEN)
    assert f"[/INST]{CALL}{end}[TOOL_RESULTS]2048[/TOOL_RESULTS]{ANSWERS[0]}{end}" in text
    assert masked(mistral, CHAT) == [f"{CALL}{end}", f"{ANSWERS[0]}{end}", f"{ANSWERS[1]}{end}"]
    assert dropped_calls(mistral, CHAT, tools=TOOLS) == (1, 0)


def test_each_turn_trains_after_its_own_prompt(mistral):
    """Cut after each turn, the V3 manner moves the system prompt and tools into that turn's last user
    turn: each trains after the prompt it was served."""
    end = mistral.eos_token
    wanted = [f"{CALL}{end}", f"{ANSWERS[0]}{end}", f"{ANSWERS[1]}{end}"]
    for seq, answer in zip(sequences_of([Conversation("c", CHAT, TOOLS)], "each"), wanted, strict=True):
        assert masked(mistral, seq.messages, last_only=True) == [answer]
        ids, mask = encode_conversation(mistral, seq.messages, 10_000, end_ids=frozenset({mistral.eos_token_id}),
                                        tools=TOOLS, last_only=True)
        prompt = mistral(render(mistral, seq.messages[:-1], True, tools=TOOLS), add_special_tokens=False)["input_ids"]
        assert ids[:spans(mask)[0][0]].tolist() == prompt


def test_token_exact_splices_the_answers_ids_and_leaves_the_recorded_call(mistral):
    end = mistral.eos_token_id
    sampled = [mistral(a, add_special_tokens=False)["input_ids"][::-1] for a in ANSWERS]  # not the text's tokens
    chat = [dict(m) for m in CHAT]
    chat[4]["token_ids"], chat[6]["token_ids"] = [*sampled[0], end], [*sampled[1], end]
    ids, mask = encode_conversation(mistral, chat, 10_000, True, frozenset({end}), tools=TOOLS)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled[0], end], [*sampled[1], end]]
    text_ids, _ = encode_conversation(mistral, CHAT, 10_000, tools=TOOLS)
    assert torch.equal(ids[:spans(mask)[0][0]], text_ids[:spans(mask)[0][0]])  # the prompt, the call included
