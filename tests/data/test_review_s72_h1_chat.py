"""chat.py behaviours (lines 233-520) that a mutation audit found unpinned: each test here failed under a
mutant of chat.py that the rest of the suite let pass."""

from __future__ import annotations

import json

import pytest
from test_data_chat import spans

from drafter_lab.data.chat import TemplateRefusal, encode_conversation, reads_thinking_parts, render
from drafter_lab.targets.hf import load_tokenizer

# Concatenates each call's arguments as text (DeepSeek's manner).
CONCATENATING = ("{% for m in messages %}{% for c in m['tool_calls'] or [] %}"
                 "{{ c['function']['arguments'] + '\\n' }}{% endfor %}{% endfor %}")


def _call(args) -> dict:
    return {"id": "c", "type": "function", "function": {"name": "stat", "arguments": args}}


def test_arguments_already_text_are_not_encoded_again(random_llama):
    """A caller's call whose arguments are JSON text already (as the OpenAI API carries them) goes to a
    concatenating template as it is, beside one held as an object: encoded again, it was written quoted."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = CONCATENATING
    messages = [{"role": "user", "content": "sizes?"},
                {"role": "assistant", "content": "", "tool_calls": [_call({"path": "a.py"}),
                                                                     _call(json.dumps({"path": "b.py"}))]}]
    assert render(tok, messages) == '{"path": "a.py"}\n{"path": "b.py"}\n'


# Drops every assistant turn but the last (the turn is found by its text alone, where it is found at all).
DROPS_EARLIER = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}{% continue %}{% endif %}"
                 "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("before, after", [("Say hi.", "Now say ok."), ("Greet me.", "You said hi?")])
def test_a_dropped_turn_is_not_found_in_the_messages_around_it(random_llama, before, after):
    """A turn the template drops is refused, though a user message before or after it holds its text:
    looked for from the previous turn's end to the render's end, it was found there and that user's
    text masked as the answer."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = DROPS_EARLIER
    messages = [{"role": "user", "content": before}, {"role": "assistant", "content": "hi"},
                {"role": "user", "content": after}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(TemplateRefusal, match="^chat template drops or rewrites assistant turn 1;"):
        encode_conversation(tok, messages, 10_000, end_ids=frozenset({tok.eos_token_id}))


def test_a_turn_found_by_its_text_is_looked_for_past_the_message_before_it(random_llama):
    """A template whose prompt opens a block its turns lack (DeepSeek-R1's manner) and that writes an
    earlier answer twice (no marker places it): the answer is the one past the user's "Say hi."."""
    tok = load_tokenizer(random_llama)
    end = tok.eos_token
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}U: {{ m['content'] }}\n{% else %}"
                         "A:\n{{ m['content'] }}{% if not loop.last %} ({{ m['content'] }}){% endif %}" + end +
                         "\n{% endif %}{% endfor %}{% if add_generation_prompt %}A:\n<think>\n{% endif %}")
    messages = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "Say ok."}, {"role": "assistant", "content": "ok"}]
    ids, mask = encode_conversation(tok, messages, 10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"hi (hi){end}", f"ok{end}"]


def test_an_empty_answer_after_another_trains_the_end_token_written_for_it(random_llama):
    """A template that closes an answer only once another message follows (Kimi-K2-Instruct-0905's
    manner) and an empty answer right after another: the empty turn's own render adds nothing, so its
    region runs to the next message and holds the end token written for it. Taken for its own render
    (which ends with the answer before's end token), it was an empty region, and that token unmasked."""
    tok = load_tokenizer(random_llama)
    end = tok.eos_token
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                         "{% else %}{{ m['content'] }}{% if not loop.last %}" + end + "{% endif %}{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                {"role": "assistant", "content": ""}, {"role": "user", "content": "r"},
                {"role": "assistant", "content": "b"}]
    ids, mask = encode_conversation(tok, messages, 10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"a{end}{end}", "b"]


# Writes an answer's thinking from its content parts (Magistral's manner).
READS_PARTS = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
               "{% for p in m['content'] %}{% if p['type'] == 'thinking' %}[THINK]{{ p['thinking'] }}[/THINK]"
               "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}")


def test_the_thinking_parts_probe_renders_once_per_template(random_llama, monkeypatch):
    """`render` asks `reads_thinking_parts` on every call: its probe render is kept per tokenizer until
    the template changes, not run again each time."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = READS_PARTS
    calls, real = [], tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert reads_thinking_parts(tok) and reads_thinking_parts(tok) and len(calls) == 1
    tok.chat_template = READS_PARTS.replace("[THINK]{{ p['thinking'] }}[/THINK]", "")
    assert not reads_thinking_parts(tok) and not reads_thinking_parts(tok) and len(calls) == 2


def test_an_answer_at_the_start_of_the_render_is_placed(random_llama):
    """A conversation that opens with the assistant's greeting, under a template that writes no header:
    that turn begins at offset 0 and is masked there, with its end token."""
    tok = load_tokenizer(random_llama)
    end = tok.eos_token
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}" + end +
                         "{% else %}\n{% endif %}{% endfor %}")
    messages = [{"role": "assistant", "content": "Hi, how can I help?"}, {"role": "user", "content": "Say ok."},
                {"role": "assistant", "content": "ok"}]
    ids, mask = encode_conversation(tok, messages, 10_000, end_ids=frozenset({tok.eos_token_id}))
    assert mask[0] and [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"Hi, how can I help?{end}", f"ok{end}"]
