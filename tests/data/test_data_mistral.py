"""Mistral's chat templates: no generation prompt (the answer follows `[/INST]`), the end-of-turn token
written by the template after each answer, calls as `[TOOL_CALLS]name[ARGS]arguments` control tokens,
results in `[TOOL_RESULTS]`. The V7-Tekken manner lists the system prompt and the tools up front; the
V3 manner writes them into the last user turn, so a render is no prefix of a longer one's: the masks
still land on each answer and its end token, under every `--turns`, and token-exact."""

from __future__ import annotations

import json

import pytest
import torch
from data_helpers import write_jsonl
from test_data_chat import spans, word_by_word
from test_data_reasoning import THINKING

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.capture import sequences_of
from drafter_lab.data.chat import (
    dropped_calls,
    dropped_reasoning,
    encode_conversation,
    reads_thinking_parts,
    render,
)
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import answer_fields, regenerate
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_tokenizer

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
# Magistral-Small-2509's and Ministral-3 Reasoning's manner: V7-Tekken, an answer's thinking a content part
# written in [THINK] tags before its text, in every turn; `reasoning_content` is not read.
MAGISTRAL = TEKKEN.replace(
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}",
    "{% elif m['role'] == 'assistant' %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'thinking' %}[THINK]{{ part['thinking'] }}[/THINK]"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}")
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


THOUGHTS = ["They ask for a size: stat the file.", "A thank-you: nothing to look up."]
THOUGHTFUL = [dict(m, reasoning_content=THOUGHTS[0]) if i == 2 else dict(m, reasoning_content=THOUGHTS[1]) if i == 6
              else m for i, m in enumerate(CHAT)]


def magistral_tokenizer(random_llama, template: str = MAGISTRAL):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": [*CONTROL, "[THINK]", "[/THINK]"]})
    tok.chat_template = template
    return tok


def test_thinking_kept_apart_goes_to_magistral_as_a_thinking_part(random_llama):
    """Magistral's template reads an answer's thinking from a content part alone: handed
    `reasoning_content` (until 2026-12-03), it wrote every answer without its thinking."""
    tok = magistral_tokenizer(random_llama)
    end = tok.eos_token
    assert reads_thinking_parts(tok)
    text = render(tok, THOUGHTFUL, tools=TOOLS)
    assert f"[/INST][THINK]{THOUGHTS[0]}[/THINK]{CALL}{end}" in text
    assert f"[/INST][THINK]{THOUGHTS[1]}[/THINK]{ANSWERS[1]}{end}" in text
    assert dropped_reasoning(tok, THOUGHTFUL, tools=TOOLS) == (2, 0)
    assert masked(tok, THOUGHTFUL) == [f"[THINK]{THOUGHTS[0]}[/THINK]{CALL}{end}", f"{ANSWERS[0]}{end}",
                                       f"[THINK]{THOUGHTS[1]}[/THINK]{ANSWERS[1]}{end}"]
    # Token-exact, the sampled ids (thinking, tags and answer) take the turn's place.
    sampled = word_by_word(tok, f"[THINK]{THOUGHTS[1]}[/THINK]{ANSWERS[1]}")
    exact = [*THOUGHTFUL[:6], dict(THOUGHTFUL[6], token_ids=sampled)]
    ids, mask = encode_conversation(tok, exact, 10_000, True, frozenset({tok.eos_token_id}), tools=TOOLS,
                                    last_only=True)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, tok.eos_token_id]]
    # A Mistral template without thinking leaves it out, and says so.
    plain = magistral_tokenizer(random_llama, TEKKEN)
    assert not reads_thinking_parts(plain)  # it writes the parts' repr: a list taken for text
    assert THOUGHTS[1] not in render(plain, THOUGHTFUL, tools=TOOLS)
    assert dropped_reasoning(plain, THOUGHTFUL, tools=TOOLS) == (2, 2)


def test_templates_that_take_text_do_not_read_thinking_parts(random_llama):
    for template in (V3, THINKING, None):  # Mistral V3, Qwen3's manner, the lab's ChatML
        tok = load_tokenizer(random_llama)
        if template is not None:
            tok.chat_template = template
        assert not reads_thinking_parts(tok)
        tok.chat_template = MAGISTRAL  # the answer follows the template the tokenizer has now
        assert reads_thinking_parts(tok)


def test_a_local_regeneration_keeps_the_think_tags_and_encodes_as_the_split_form(random_llama, monkeypatch):
    """Mistral's tags are control tokens, which decoding without special tokens dropped (the thinking ran
    into the answer); kept, the inline answer renders as the template writes the split one."""
    tok = magistral_tokenizer(random_llama)
    written = f"[THINK]{THOUGHTS[1]}[/THINK]{ANSWERS[1]}"
    ids = tok(written, add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == THOUGHTS[1] + ANSWERS[1]
    assert answer_fields(tok, text, ids) == {"content": written}
    target = load_target(random_llama)
    target.tokenizer = tok
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda t, prompts, g: [(text, ids)] * len(prompts))
    asked = CHAT[5:6]
    (conv,) = regenerate(target, [Conversation("c", [*asked, {"role": "assistant", "content": "Old."}])],
                         show_progress=False)
    assert conv.messages[-1]["content"] == written
    assert dropped_reasoning(tok, conv.messages) == (1, 0)
    end = frozenset({tok.eos_token_id})
    inline = encode_conversation(tok, conv.messages, 10_000, end_ids=end)
    split = encode_conversation(tok, [*asked, {"role": "assistant", "content": ANSWERS[1],
                                               "reasoning_content": THOUGHTS[1]}], 10_000, end_ids=end)
    assert torch.equal(inline[0], split[0]) and torch.equal(inline[1], split[1])
    assert [tok.decode(inline[0][a:b]) for a, b in spans(inline[1])] == [f"{written}{tok.eos_token}"]


def test_thinking_parts_are_read_as_reasoning(tmp_path):
    def turn(content, **kw):
        return {"messages": [{"role": "user", "content": "How big is setup.py?"},
                             {"role": "assistant", "content": content, **kw}]}

    think = {"type": "thinking", "thinking": THOUGHTS[0]}
    text = {"type": "text", "text": ANSWERS[0]}
    convs, _ = read_conversations(write_jsonl(tmp_path / "ok.jsonl", [turn([think, text]), turn([think])]))
    assert convs[0].messages[-1] == {"role": "assistant", "content": ANSWERS[0], "reasoning_content": THOUGHTS[0]}
    assert convs[1].messages[-1] == {"role": "assistant", "content": "", "reasoning_content": THOUGHTS[0]}
    for row, error in [(turn([text, think]), "thinking parts go ahead of its text"),
                       (turn([think, text], reasoning_content="Also."), "thinking both as content parts"),
                       (turn([{"type": "thinking", "thinking": None}, text]), "a thinking part needs its text"),
                       ({"messages": [{"role": "user", "content": [think, text]}, {"role": "assistant", "content": "A."}]},
                        "on an assistant turn")]:
        with pytest.raises(LabError, match=error):
            read_conversations(write_jsonl(tmp_path / "bad.jsonl", [row]))
