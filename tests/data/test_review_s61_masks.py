"""Loss masks under templates that move, check or run messages together: DeepSeek-V3's joins every
system turn at the top of the render (ahead of the answers around it); Mistral's tool templates refuse
user and assistant turns that do not alternate, turns with calls aside; Mistral's writes consecutive
answers with nothing between them (an empty one is its `</s>` alone). And a thinking that quotes its
answer ahead of a literal end token."""

from __future__ import annotations

import pytest
from test_data_chat import spans, word_by_word
from test_data_hidden_thinking import stops, templated
from test_data_reasoning import THINKING

from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.chat import encode_conversation
from drafter_lab.data.conversations import Conversation
from drafter_lab.data.encodings import encoded

END = "<｜end▁of▁sentence｜>"
# DeepSeek-V3's released template, tool branches left out: all system turns joined (with blank lines)
# after the bos, then each user turn after `<｜User｜>` and each answer after `<｜Assistant｜>`.
DEEPSEEK_V3 = (
    "{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}"
    "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}"
    "{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}"
    "{%- elif message['role'] == 'assistant' %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- endif %}{%- endfor -%}{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}"
)


def ask(text: str) -> dict:
    return {"role": "user", "content": text}


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


@pytest.mark.parametrize("chat", [
    [ask("Hi"), answer("One."), {"role": "system", "content": "Now be formal."}, ask("And?"), answer("Good day.")],
    [answer("Welcome."), {"role": "system", "content": "Be brief."}, answer("One."),
     {"role": "system", "content": "Now be formal."}, ask("And?"), answer("Good day.")],
], ids=["system-between-turns", "answers-around-system-turns"])
def test_a_system_turn_the_template_moves_to_the_top_does_not_end_the_turn_before_it(random_llama, chat):
    """The turn before a system turn is written otherwise once later turns follow (the system text
    joins the top), so its region ran to where the next message's text begins: the system text, written
    ahead of the turn, left it an empty region and the turn trained nothing, unnoticed."""
    tok = templated(random_llama, DEEPSEEK_V3)
    tok.bos_token, tok.eos_token = "<｜begin▁of▁sentence｜>", END
    answers = [m["content"] for m in chat if m["role"] == "assistant"]
    ids, mask = encode_conversation(tok, chat, 10_000, end_ids=stops(tok))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + END for a in answers]
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m for m in chat]
    ids, mask = encode_conversation(tok, exact, 10_000, True, stops(tok))
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*word_by_word(tok, a), *stops(tok)] for a in answers]


# Mistral-7B-Instruct-v0.3's tool template, trimmed: user and assistant turns must alternate, turns
# with calls and tool results aside; a call is written as `[TOOL_CALLS]` and its JSON, closed by eos.
MISTRAL_TOOLS = (
    "{%- set ns = namespace(index=0) %}{%- for message in messages %}"
    "{%- if not (message.role == 'tool' or (message.tool_calls is defined and message.tool_calls is not none)) %}"
    "{%- if (message['role'] == 'user') != (ns.index % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{%- endif %}{%- set ns.index = ns.index + 1 %}{%- endif %}{%- endfor %}"
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}{{- '[TOOL_CALLS] [' }}"
    "{%- for tool_call in message.tool_calls %}{{- (tool_call.function|tojson)[:-1] + ', \"id\": \"' + tool_call.id + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}{%- endfor %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content']|trim + eos_token }}"
    "{%- elif message['role'] == 'tool' %}{{- '[TOOL_RESULTS] {\"content\": ' + message.content|string + ', ' }}"
    "{{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}{%- endif %}{%- endfor %}"
)
MISTRAL_SPECIAL = ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
CALL = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "stat", "arguments": {"path": "setup.py"}}}


def test_a_template_refusing_a_turn_bare_of_its_calls_encodes_the_conversation(random_llama):
    """Whether a template writes a turn's calls was found by rendering the conversation without them:
    Mistral's refuses that render (the turns of calls become answers, and two answers follow one user
    turn), and every such conversation was refused with it, though its masks were found."""
    tok = templated(random_llama, MISTRAL_TOOLS, MISTRAL_SPECIAL)
    tok.bos_token, tok.eos_token = "<s>", "</s>"
    calling = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    chat = [ask("How big is setup.py?"), calling, {"role": "tool", "content": "2048", "tool_call_id": CALL["id"]},
            calling, {"role": "tool", "content": "2048", "tool_call_id": CALL["id"]}, answer("It is 2 KB.")]
    call = '[TOOL_CALLS] [{"name": "stat", "arguments": {"path": "setup.py"}, "id": "a1b2c3d4e"}]</s>'
    every = encoded(Conversation("c", chat), tok, CaptureConfig(max_length=10_000), stops(tok, "</s>"))
    assert [tok.decode(every.ids[a:b]) for a, b in spans(every.mask)] == [call, call, " It is 2 KB.</s>"]
    assert every.calls == (2, 0)
    # `--turns each`: the sequence cut after the second call trains that call alone.
    second = encoded(Conversation("c#turn2", chat[:4]), tok, CaptureConfig(max_length=10_000, turns="each"),
                     stops(tok, "</s>"))
    assert [tok.decode(second.ids[a:b]) for a, b in spans(second.mask)] == [call]
    assert second.calls == (1, 0)


@pytest.mark.parametrize("last_only", [False, True])
def test_a_thinking_holding_the_answer_before_a_literal_end_token_trains_whole(random_llama, last_only):
    """The end-of-turn token is looked for past the answer (a literal one written in it is its text):
    the answer was looked for from the turn's start, so found inside a thinking that quotes it, and a
    literal `<|im_end|>` later in that thinking ended the mask: the rest of the thinking, the answer
    and the real end token went untrained (token-exact, the template's text from there followed the
    sampled ids again)."""
    tok = templated(random_llama, THINKING, [])
    thought, reply = "Reply ok, then the template closes the turn with <|im_end|> after it.", "ok"
    chat = [ask("Say ok"), {"role": "assistant", "content": reply, "reasoning_content": thought}]
    want = f"<think>\n{thought}\n</think>\n\n{reply}<|im_end|>"
    ids, mask = encode_conversation(tok, chat, 10_000, end_ids=stops(tok, "<|im_end|>"), last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [want]
    sampled = word_by_word(tok, want.removesuffix("<|im_end|>"))
    exact = [chat[0], dict(chat[1], token_ids=sampled)]
    ids, mask = encode_conversation(tok, exact, 10_000, True, stops(tok, "<|im_end|>"), last_only=last_only)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, *stops(tok, "<|im_end|>")]]
    assert tok.decode(ids) == f"<|im_start|>user\nSay ok<|im_end|>\n<|im_start|>assistant\n{want}\n"


# Mistral-Small-3's manner (V7-Tekken): no generation prompt, each answer right after `[/INST]` or the
# answer before it, closed by eos.
MISTRAL_V7 = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'system' %}"
    "{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- endif %}{%- endfor %}"
)


@pytest.mark.parametrize("answers", [["One.", ""], ["", ""], ["One.", "", "Three."]])
def test_an_empty_answer_right_after_another_is_its_end_token(random_llama, answers):
    """The stop token right after a turn's own render was taken as that turn's (for templates that
    close a turn only once another follows): after Mistral's `One.</s>` it was the next, empty answer's
    `</s>`, which was then placed nowhere, and the conversation was refused ("drops or rewrites")."""
    tok = templated(random_llama, MISTRAL_V7, ["<s>", "</s>", "[INST]", "[/INST]"])
    tok.bos_token, tok.eos_token = "<s>", "</s>"
    chat = [ask("Count."), *map(answer, answers)]
    ids, mask = encode_conversation(tok, chat, 10_000, end_ids=stops(tok, "</s>"))
    assert tok.decode(ids[mask]) == "".join(a + "</s>" for a in answers)
    assert tok.decode(ids[~mask]) == "<s>[INST]Count.[/INST]"
    ids, mask = encode_conversation(tok, chat, 10_000, end_ids=stops(tok, "</s>"), last_only=True)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [answers[-1] + "</s>"]
