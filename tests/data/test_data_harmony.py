"""GPT-OSS's harmony format: thinking is read from a dataset's `thinking` and handed to the template
under that name; the last turn's analysis and final channels train up to `<|return|>`, and an earlier
turn, which the template closes with `<|end|>` where its own render has `<|return|>`, trains its
final channel up to that `<|end|>` (until 2026-12-02 its mask held one token). With tools, in
GPT-OSS's manner: a call trains up to `<|call|>`, and the answer after its result from its analysis."""

from __future__ import annotations

import json

import pytest
from data_helpers import write_jsonl
from test_data_chat import spans, word_by_word

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.chat import dropped_calls, dropped_reasoning, encode_conversation, render
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import answer_fields, regenerate
from drafter_lab.targets.hf import load_target, load_tokenizer

# In the manner of GPT-OSS's template: the last assistant turn of a training render shows its
# thinking (`thinking`) in the analysis channel and ends its final channel with `<|return|>`; earlier
# turns show the final channel alone, closed with `<|end|>`; the generation prompt is `<|start|>assistant`.
HARMONY = (
    "<|start|>system<|message|>You are a helpful model.<|end|>"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|start|>developer<|message|># Instructions\n\n{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'user' %}<|start|>user<|message|>{{ m['content'] }}<|end|>"
    "{% elif loop.last and not add_generation_prompt %}"
    "{% if 'thinking' in m %}<|start|>assistant<|channel|>analysis<|message|>{{ m['thinking'] }}<|end|>{% endif %}"
    "<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|return|>"
    "{% else %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
SPECIAL = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>"]
ASKED = [{"role": "system", "content": "You explain Python source."},
         {"role": "user", "content": "What does os.path.join do?"}]
THOUGHT, ANSWER = "They ask about join.", "It joins path parts."
LATER = [{"role": "user", "content": "And split?"},
         {"role": "assistant", "content": "It returns (head, tail).", "reasoning_content": "Split undoes join."}]


@pytest.fixture
def harmony(random_llama):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = HARMONY
    return tok


def returns(tok) -> frozenset[int]:
    return frozenset({tok.convert_tokens_to_ids("<|return|>")})  # GPT-OSS stops at it


def test_a_datasets_thinking_reaches_the_template_as_thinking(harmony, tmp_path, monkeypatch):
    row = {"messages": [*ASKED, {"role": "assistant", "content": ANSWER, "thinking": THOUGHT}]}
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row]))
    assert conv.messages[-1] == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    seen = []
    real = harmony.apply_chat_template
    monkeypatch.setattr(harmony, "apply_chat_template", lambda messages, **kw: seen.append(messages) or real(messages, **kw))
    text = render(harmony, conv.messages)
    assert seen[-1][-1]["thinking"] == THOUGHT  # the render (a probe of the template may come first)
    assert f"<|channel|>analysis<|message|>{THOUGHT}<|end|>" in text
    assert dropped_reasoning(harmony, conv.messages) == (1, 0)


def test_the_last_turn_trains_analysis_and_final_up_to_return(harmony):
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"]



def test_a_local_regeneration_splits_the_channels_as_a_server_does(harmony, random_llama, monkeypatch):
    """Decoded without its special tokens, a GPT-OSS answer ran its channel names into its texts, which a
    capture of the text then trained as one final answer; it is split as vLLM's and SGLang's GPT-OSS
    parsers split it, and the template writes the analysis where the target did."""
    written = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}"
    ids = harmony(written, add_special_tokens=False)["input_ids"]
    text = harmony.decode(ids, skip_special_tokens=True)
    assert text == f"analysis{THOUGHT}assistantfinal{ANSWER}"
    assert answer_fields(harmony, text, ids) == {"content": ANSWER, "reasoning_content": THOUGHT}
    final = harmony(f"<|channel|>final<|message|>{ANSWER}", add_special_tokens=False)["input_ids"]
    assert answer_fields(harmony, "", final) == {"content": ANSWER}
    plain = load_tokenizer(random_llama)  # no channels: the text, as before
    assert answer_fields(plain, "It is.", plain("It is.", add_special_tokens=False)["input_ids"]) == {"content": "It is."}
    target = load_target(random_llama)
    target.tokenizer = harmony
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda t, prompts, g: [(text, ids)] * len(prompts))
    old = {"role": "assistant", "content": "Old.", "reasoning_content": "Old thought."}
    (conv,) = regenerate(target, [Conversation("c", [*ASKED, old])], show_progress=False)
    assert (conv.messages[-1]["content"], conv.messages[-1]["reasoning_content"]) == (ANSWER, THOUGHT)
    ids, mask = encode_conversation(harmony, conv.messages, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)] == [f"{written}<|return|>"]

@pytest.mark.parametrize("thought", [False, True], ids=["answer-only", "with-thinking"])
def test_an_earlier_turn_trains_its_final_channel_up_to_end(harmony, thought):
    first = {"role": "assistant", "content": ANSWER, **({"reasoning_content": THOUGHT} if thought else {})}
    chat = [*ASKED, first, *LATER]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"<|channel|>final<|message|>{ANSWER}<|end|>",
        "<|channel|>analysis<|message|>Split undoes join.<|end|><|start|>assistant<|channel|>final<|message|>"
        "It returns (head, tail).<|return|>"]
    assert dropped_reasoning(harmony, chat) == (1 + thought, thought)  # earlier thinking is dropped


def test_token_exact_the_sampled_channels_stand_for_the_turn(harmony):
    written = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}"
    sampled = word_by_word(harmony, written)
    (end,) = returns(harmony)
    turn = {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "token_ids": [*sampled, end]}
    ids, mask = encode_conversation(harmony, [*ASKED, turn], max_length=10_000, token_exact=True,
                                    end_ids=returns(harmony))
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, end]]
    assert harmony.decode(ids).count(THOUGHT) == 1


def test_token_exact_an_earlier_turn_is_its_sampled_channels_then_end(harmony):
    """The sampled ids stand for the whole final channel the template wrote for an earlier turn (not
    for the empty stretch before its first special token), closed by the template's `<|end|>`."""
    (end,) = returns(harmony)
    sampled = word_by_word(harmony, f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant"
                                    f"<|channel|>final<|message|>{ANSWER}")
    later = word_by_word(harmony, "<|channel|>final<|message|>It returns (head, tail).")
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "token_ids": [*sampled, end]},
            LATER[0], {"role": "assistant", "content": "It returns (head, tail).", "token_ids": [*later, end]}]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, token_exact=True, end_ids=returns(harmony))
    close = harmony.convert_tokens_to_ids("<|end|>")
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, close], [*later, end]]
    assert harmony.decode(ids).count(ANSWER) == 1


@pytest.mark.parametrize("reply", ["Thanks", "a"], ids=["quoted-in-the-answer", "in-the-header"])
def test_an_earlier_turn_ends_where_the_next_message_begins_not_where_its_text_first_appears(harmony, reply):
    """A short next message ("Thanks", "a") is found inside the answer before it, or inside the
    template's own header: the turn is bounded by where the next message is written, not by the first
    place its text appears (until 2026-12-02 the mask was the one `<|channel|>` token again)."""
    answer = "It joins path parts. Thanks for asking, a fine question."
    chat = [*ASKED, {"role": "assistant", "content": answer}, {"role": "user", "content": reply}, LATER[1]]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)][0] == f"<|channel|>final<|message|>{answer}<|end|>"
    (end,) = returns(harmony)
    sampled = word_by_word(harmony, f"<|channel|>final<|message|>{answer}")
    later = word_by_word(harmony, "<|channel|>final<|message|>It returns (head, tail).")
    chat[2] = {**chat[2], "token_ids": [*sampled, end]}
    chat[4] = {"role": "assistant", "content": LATER[1]["content"], "token_ids": [*later, end]}
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, token_exact=True, end_ids=returns(harmony))
    assert ids[slice(*spans(mask)[0])].tolist() == [*sampled, harmony.convert_tokens_to_ids("<|end|>")]


def test_sampling_records_do_not_reach_the_template(harmony, monkeypatch):
    seen = []
    real = harmony.apply_chat_template
    monkeypatch.setattr(harmony, "apply_chat_template", lambda messages, **kw: seen.append(messages) or real(messages, **kw))
    turn = {"role": "assistant", "content": ANSWER, "token_ids": [1, 2], "temperature": 1.0,
            "target_fingerprint": "ab", "rendered_with": {"chat_template_sha256": "cd"}}
    render(harmony, [*ASKED, turn])
    assert seen[-1][-1] == {"role": "assistant", "content": ANSWER}


def test_a_template_writing_the_next_message_twice_falls_back_to_the_whole_text(harmony):
    """Message 3's text also heads the render: the marked render differs from the real one by more
    than the replacement, so the turn is not bounded by the first marker (the header)."""
    harmony.chat_template = "{% if messages | length > 3 %}{{ messages[3]['content'] }}|{% endif %}" + HARMONY
    chat = [*ASKED, {"role": "assistant", "content": ANSWER}, *LATER]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    # No render is a prefix of another here: the turn starts past the message before it.
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)][0] == f"<|channel|>final<|message|>{ANSWER}<|end|>"


# GPT-OSS's manner with tools: a call is a message of its own to `functions.NAME` on the commentary
# channel, closed by `<|call|>` (a token the target stops at), with the analysis before it written
# only until a final answer follows; a result comes from `functions.NAME` with its text as JSON; the
# template writes the first call of a turn alone (the model makes one per turn).
HARMONY_TOOLS = (
    "<|start|>system<|message|>Reasoning: medium{% if tools %}\nCalls to these tools must go to the commentary "
    "channel: 'functions'.{% endif %}<|end|>"
    "{% if tools %}<|start|>developer<|message|># Tools\n\nnamespace functions {\n{% for t in tools %}"
    "// {{ t['function']['description'] }}\ntype {{ t['function']['name'] }} = (_: any) => any;\n{% endfor %}}<|end|>{% endif %}"
    "{% set called = namespace(name=none) %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|start|>user<|message|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'tool' %}<|start|>functions.{{ called.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ m['content'] | tojson }}<|end|>"
    "{% elif m['role'] == 'assistant' and m['tool_calls'] %}"
    "{% set final = namespace(later=false) %}{% for f in messages[loop.index:] %}"
    "{% if f['role'] == 'assistant' and not f['tool_calls'] %}{% set final.later = true %}{% endif %}{% endfor %}"
    "{% if m['thinking'] and not final.later %}<|start|>assistant<|channel|>analysis<|message|>{{ m['thinking'] }}<|end|>{% endif %}"
    "{% set c = m['tool_calls'][0]['function'] %}{% set called.name = c['name'] %}"
    "<|start|>assistant to=functions.{{ c['name'] }}<|channel|>commentary json<|message|>{{ c['arguments'] | tojson }}<|call|>"
    "{% elif m['role'] == 'assistant' and loop.last and not add_generation_prompt %}"
    "{% if m['thinking'] %}<|start|>assistant<|channel|>analysis<|message|>{{ m['thinking'] }}<|end|>{% endif %}"
    "<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|return|>"
    "{% elif m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
STAT = {"type": "function", "function": {"name": "stat", "description": "A file's size in bytes",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
CALLED = " to=functions.stat<|channel|>commentary json<|message|>{\"path\": \"setup.py\"}"


@pytest.fixture
def harmony_tools(harmony):
    harmony.add_special_tokens({"additional_special_tokens": [*SPECIAL, "<|call|>"]})
    harmony.chat_template = HARMONY_TOOLS
    return harmony


def stops(tok) -> frozenset[int]:
    return frozenset(tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>"))  # GPT-OSS's generation config


def tool_loop(tmp_path, result: str = "2048", calls: int = 1):
    """A conversation read as a dataset holds it: a call with the thinking before it, its result, an
    answer with its own thinking."""
    call = {"type": "function", "function": {"name": "stat", "arguments": json.dumps({"path": "setup.py"})}}
    row = {"tools": [STAT], "messages": [
        {"role": "user", "content": "How big is setup.py?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need stat.", "tool_calls": [call] * calls},
        *[{"role": "tool", "content": result}] * calls,
        {"role": "assistant", "content": "It is 2 KB.", "reasoning_content": "2048 bytes."}]}
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row]))
    return conv


@pytest.mark.parametrize("result", ["2048", 'line 1\n"size": 2048'], ids=["plain", "escaped-by-tojson"])
def test_a_gpt_oss_call_trains_up_to_call_and_the_answer_after_it_from_its_analysis(harmony_tools, tmp_path, result):
    """The call's region runs to `<|call|>` (the render of the turn alone writes its analysis, which a
    later final answer drops); the answer's turn starts past the result and the generation prompt
    (the render of the turns before it still has that analysis); a result the template escapes is
    placed all the same. Until 2026-12-02 the call masked ` to=functions.stat<|channel|>` and the
    answer lost its analysis."""
    conv = tool_loop(tmp_path, result)
    text = render(harmony_tools, conv.messages, tools=conv.tools)
    assert "Need stat." not in text and json.dumps(result) in text
    ids, mask = encode_conversation(harmony_tools, conv.messages, 10_000, end_ids=stops(harmony_tools), tools=conv.tools)
    assert [harmony_tools.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"{CALLED}<|call|>",
        "<|channel|>analysis<|message|>2048 bytes.<|end|><|start|>assistant<|channel|>final<|message|>It is 2 KB.<|return|>"]


def test_token_exact_a_sampled_gpt_oss_call_stands_for_its_turn(harmony_tools, tmp_path):
    """The ids a server returns for a call (analysis and call, up to `<|call|>`) replace what the
    template wrote for the turn; the answer's ids follow the result."""
    conv = tool_loop(tmp_path)
    called = word_by_word(harmony_tools, f"<|channel|>analysis<|message|>Need stat.<|end|><|start|>assistant{CALLED}")
    answered = word_by_word(harmony_tools, "<|channel|>analysis<|message|>2048 bytes.<|end|><|start|>assistant"
                                           "<|channel|>final<|message|>It is 2 KB.")
    call_id, return_id = (harmony_tools.convert_tokens_to_ids(t) for t in ("<|call|>", "<|return|>"))
    messages = [*conv.messages]
    messages[1] = {**messages[1], "token_ids": [*called, call_id]}
    messages[3] = {**messages[3], "token_ids": [*answered, return_id]}
    ids, mask = encode_conversation(harmony_tools, messages, 10_000, token_exact=True, end_ids=stops(harmony_tools),
                                    tools=conv.tools)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*called, call_id], [*answered, return_id]]
    assert harmony_tools.decode(ids).count("2048 bytes.") == 1


def test_a_template_writing_a_turns_first_call_alone_is_noted(harmony_tools, tmp_path):
    """GPT-OSS's template writes one call per turn: a dataset's parallel calls lose all but the first."""
    for calls, dropped in ((1, 0), (2, 1)):
        conv = tool_loop(tmp_path, calls=calls)
        assert dropped_calls(harmony_tools, conv.messages, tools=conv.tools) == (1, dropped)


def test_a_message_the_template_does_not_write_bounds_no_turn(harmony):
    """A tool result after an earlier turn, to a template without a branch for it (it writes nothing
    of it): the turn runs on to the first special token after its answer, as with no bound."""
    harmony.chat_template = HARMONY.replace("{% else %}", "{% elif m['role'] == 'assistant' %}")
    chat = [*ASKED, {"role": "assistant", "content": ANSWER}, {"role": "tool", "content": "unused"}, *LATER]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)][0] == f"<|channel|>final<|message|>{ANSWER}<|end|>"
