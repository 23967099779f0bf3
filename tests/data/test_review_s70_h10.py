"""Follow-ups on the conversations reader (tool ids that are no text; how deep a row may nest) and a
mutation audit of chat.py: each test failed under the bug or mutant its docstring names."""

from __future__ import annotations

import json
import sys

import pytest

from drafter_lab.data.chat import TemplateRefusal, encode_conversation, render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

ASK = {"role": "user", "content": "What time is it?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": {}}}


def refusal(tmp_path, turns: list) -> str:
    """The error reading a file whose second line holds `turns` (its first line is a good conversation)."""
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": t}) for t in ([ASK, {"role": "assistant", "content": "ok"}],
                                                                         turns)) + "\n")
    with pytest.raises(LabError) as e:
        read_conversations(path)
    return str(e.value)


@pytest.mark.parametrize("key", ["tool_call_id", "name"])
@pytest.mark.parametrize("value", [1, ["c1"], True])
def test_a_tool_turns_call_id_or_name_that_is_no_text_is_refused(tmp_path, key, value):
    """The OpenAI API's tool message, and SGLang's and vLLM's request models, take both as text (a server
    refuses a number): one was dropped silently, so the template rendered the result answering no call."""
    result = {"role": "tool", "content": "12:00", "tool_call_id": "c1", key: value}
    message = refusal(tmp_path, [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}, result,
                                 {"role": "assistant", "content": "noon"}])
    assert message == f"{tmp_path / 'bad.jsonl'}: line 2: a tool turn's {key} is {type(value).__name__}, not text"


def test_a_tool_calls_id_that_is_no_text_is_refused(tmp_path):
    """A call's id pairs with the tool_call_id of the result that answers it: a number one was dropped
    silently while that result's was refused."""
    message = refusal(tmp_path, [ASK, {"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": 7}]},
                                 {"role": "assistant", "content": "noon"}])
    assert message.endswith("line 2: a tool call's id is int, not text")


def test_a_row_nested_as_deep_as_json_reads_is_read(tmp_path):
    """Reading a row goes no deeper than writing it back: a row json.loads reads never fails json.dumps
    for depth (the reader has no handler for that), and one deeper is refused as no valid JSON."""
    path = tmp_path / "deep.jsonl"
    outcomes = []
    for depth in range(sys.getrecursionlimit() // 2, sys.getrecursionlimit() + 2):
        path.write_text(json.dumps({"conversations": [ASK, {"role": "assistant", "content": "ok"}]})[:-1]
                        + ', "extra": ' + "[" * depth + "]" * depth + "}\n")
        try:
            read_conversations(path)
            outcomes.append("read")
        except LabError as e:  # a RecursionError would fail the test here
            assert "line 1 is not valid JSON (maximum recursion depth exceeded" in str(e)
            outcomes.append("refused")
    assert outcomes[0] == "read" and outcomes[-1] == "refused"
    assert outcomes == sorted(outcomes)  # every read depth below every refused one


# Writes an answer otherwise than the target sampled it (in brackets), and no end-of-turn token.
BRACKETED = ("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
             "{% else %}A: [{{ m['content'] }}]\n{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}")


def test_token_exact_an_answer_rewritten_without_an_end_token_is_refused(random_llama):
    """Token-exact, a rewritten answer is looked for only up to the turn's end-of-turn token: without
    one, the template's refusal (looked for to the end of the text, a later turn's words could take the
    target's tokens; a mutant found it anyway, another placed it at the text's first character)."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = BRACKETED
    answer = "It is noon."
    chat = [ASK, {"role": "assistant", "content": answer, "token_ids": tok.encode(answer, add_special_tokens=False)}]
    with pytest.raises(TemplateRefusal, match="rewrites assistant turn 1"):
        encode_conversation(tok, chat, 512, token_exact=True)


def test_arguments_a_template_took_as_text_go_as_text_to_every_later_render(random_llama):
    """Once a render needs a call's arguments as text (here the last message's calls alone are joined
    to text), the renders after it hand them so too: the turns before the last render as the whole does,
    so the prefix the loss mask is found with stays a prefix (uncached, it wrote them as an object)."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = (
        "{% for m in messages %}{% set last = loop.last %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% for c in m['tool_calls'] or [] %}<tool_call>{% if last %}{{ '' + c['function']['arguments'] }}"
        "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}</tool_call>{% endfor %}<|im_end|>\n"
        "{% endfor %}")
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    chat = [ASK, call, {"role": "tool", "content": "12:00", "tool_call_id": "c1"}, call]
    assert render(tok, chat).startswith(render(tok, chat[:3]))
