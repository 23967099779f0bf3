"""Counts and loss masks of chat.py that no other test pinned (a second mutation audit): each test here
failed under a mutant of chat.py that the rest of the suite let pass."""

from __future__ import annotations

import pytest
from test_data_chat import spans, templated

from drafter_lab.data.capture_config import TEMPLATE_DATE
from drafter_lab.data.chat import (
    dropped_calls,
    dropped_reasoning,
    encode_conversation,
    pinned,
    reads_clock,
    render,
)

ASK = {"role": "user", "content": "What time is it?"}
CALL = {"type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}}
LATER = {**CALL, "function": {"name": "now", "arguments": {"tz": "CET"}}}
RESULT = {"role": "tool", "content": "12:00"}
NOON = {"role": "assistant", "content": "Noon."}


def chatml(calls: str, check: str = "") -> str:
    """ChatML writing each assistant turn's calls as `calls` does, after `check` per message."""
    return ("{% for m in messages %}" + check + "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}" + calls +
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


EVERY_CALL = "{% for c in m['tool_calls'] or [] %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
# GPT-OSS's manner: a turn's first call alone.
FIRST_CALL = "{% if m['tool_calls'] %}<tool_call>{{ m['tool_calls'][0]['function'] | tojson }}</tool_call>{% endif %}"
# Mistral's tool templates' manner: an assistant turn with neither text nor calls is refused.
NEEDS_TEXT_OR_CALLS = ("{% if m['role'] == 'assistant' and not m['content'] and not m['tool_calls'] %}"
                       "{{ raise_exception('an assistant turn needs content or tool calls') }}{% endif %}")


def masked(tok, messages: list[dict]) -> list[str]:
    ends = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    ids, mask = encode_conversation(tok, messages, max_length=10_000, end_ids=ends)
    return [tok.decode(ids[a:b]) for a, b in spans(mask)]


def test_calls_whose_removal_the_template_refuses_are_written(random_llama):
    """Removing a turn's calls to see whether the template writes them leaves a turn it refuses
    (Mistral's): a refusal is no render alike, so the calls, which it writes, are not counted dropped."""
    tok = templated(random_llama, chatml(EVERY_CALL, NEEDS_TEXT_OR_CALLS))
    chat = [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}, RESULT, NOON]
    assert dropped_calls(tok, chat) == (1, 0)


@pytest.mark.parametrize("template, dropped", [(FIRST_CALL, 1), (EVERY_CALL, 0)], ids=["first-alone", "every"])
def test_a_second_call_the_template_leaves_out_is_counted(random_llama, template, dropped):
    """A turn of two calls under a template that writes its first alone (GPT-OSS's) drops one: the
    count `data prepare` reports, which a turn of two calls (the common parallel case) must reach."""
    tok = templated(random_llama, chatml(template))
    chat = [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL, LATER]}, RESULT, NOON]
    assert dropped_calls(tok, chat) == (1, dropped)


def test_a_cut_turn_of_calls_trains_them_without_the_end_token(random_llama):
    """A turn of calls cut at its token limit (no answer text to end the mask at) trains the calls the
    template writes, not the end-of-turn token after them: the target had not stopped."""
    tok = templated(random_llama, chatml(EVERY_CALL))
    cut = {"role": "assistant", "content": "", "tool_calls": [CALL], "finish_reason": "length"}
    assert masked(tok, [ASK, cut]) == ['<tool_call>{"name": "now", "arguments": {"tz": "UTC"}}</tool_call>']
    assert masked(tok, [ASK, {**cut, "finish_reason": "stop"}])[0].endswith("</tool_call><|im_end|>")


def test_a_turn_cut_while_thinking_trains_nothing_the_template_writes(random_llama):
    """Cut while it was still thinking (no answer yet), under a template that drops the thinking: what
    is written for the turn is the template's empty answer and end token, none of it the target's."""
    tok = templated(random_llama, chatml(""))
    cut = {"role": "assistant", "content": "", "reasoning_content": "Let me see", "finish_reason": "length"}
    assert masked(tok, [ASK, cut]) == []
    assert masked(tok, [ASK, {**cut, "finish_reason": "stop"}]) == ["<|im_end|>"]


@pytest.mark.parametrize("opening, closing", [("<think>", "</think>"), ("[THINK]", "[/THINK]")])
def test_inline_thinking_the_template_rewrites_is_not_counted_dropped(random_llama, opening, closing):
    """Inline thinking ("<think>R</think>A", a local regeneration's text) that the template writes as a
    block of its own (Qwen3's `<think>\\nR\\n</think>`) is shown, not dropped: its text is R, the tag
    aside."""
    tok = templated(random_llama, chatml("").replace(
        "{{ m['content'] }}",
        "{% if '" + closing + "' in m['content'] %}" + opening + "\n{{ m['content'].split('" + closing + "')[0]"
        ".split('" + opening + "')[-1].strip() }}\n" + closing + "\n\n{{ m['content'].split('" + closing + "')[-1]"
        ".strip() }}{% else %}{{ m['content'] }}{% endif %}"))
    chat = [ASK, {"role": "assistant", "content": f"{opening}It is noon in UTC{closing}Noon."}]
    assert dropped_reasoning(tok, chat) == (1, 0)


def test_a_template_with_two_stop_tokens_closes_the_open_last_turn_with_its_own(random_llama):
    """A target that stops at either of two tokens (Qwen's `<|endoftext|>` and `<|im_end|>`) under a
    template that leaves the last message open (Kimi-K2-Instruct-0905's): the last answer ends with the
    one the template writes once the conversation goes on, whichever of the two it is."""
    tok = templated(random_llama, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                  "{% if not loop.last or add_generation_prompt %}<|im_end|>\n{% endif %}{% endfor %}"
                                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ends = frozenset(tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]))
    ids, mask = encode_conversation(tok, [ASK, NOON], max_length=10_000, end_ids=ends)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == ["Noon.<|im_end|>"]


# Most templates open with `messages[0]['role'] == 'system'` (Qwen2.5's, Llama 3's): an empty list of
# messages is one they refuse.
READS_FIRST = "{% if messages[0]['role'] == 'system' %}{% endif %}" + chatml("")


@pytest.mark.parametrize("chat, last_only", [
    ([{"role": "assistant", "content": "Hi! Ask me the time."}, ASK], True),
    ([{"role": "assistant", "content": "Noon.", "reasoning_content": "The clock says 12."}], False),
], ids=["greeting-last-turn", "answer-alone"])
def test_an_answer_opening_the_conversation_is_placed_without_rendering_no_messages(random_llama, chat, last_only):
    """An assistant turn that opens the conversation (ShareGPT's greetings) has no turns before it to
    render: rendering none, a template reading the first message refused it (`--turns last`, or an
    answer alone whose thinking the template drops)."""
    tok = templated(random_llama, READS_FIRST)
    ends = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=ends, last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [chat[0]["content"] + "<|im_end|>"]


def test_named_templates_that_read_the_clock_render_the_pinned_day(random_llama):
    """A tokenizer of named templates (Command-R's and Hermes' `default` and `tool_use`) reads the clock
    where any of them does: its day is pinned and rendered, not the day the run happens to render on."""
    dated = '{{ "Today is " + strftime_now("%Y-%m-%d") + ".\\n" }}' + chatml("")
    tok = templated(random_llama, {"default": dated, "tool_use": dated + "{# tools #}"})
    assert reads_clock(tok) and TEMPLATE_DATE in pinned(tok, None)
    assert render(tok, [ASK, NOON], template_kwargs={TEMPLATE_DATE: "2021-03-04"}).startswith("Today is 2021-03-04.")


def test_a_sampled_special_token_does_not_end_a_turn_of_empty_text(random_llama):
    """Token-exact, an answer whose text came back empty (its ids special tokens a server skips when it
    detokenizes) under a template that leaves the last message open (Kimi-K2-Instruct-0905's): its
    mask is the sampled ids and the end token the template writes after them, not cut at the first
    special token the target sampled."""
    tok = templated(random_llama, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                                  "{% if not loop.last or add_generation_prompt %}<|im_end|>\n{% endif %}{% endfor %}"
                                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    end, special = tok.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    sampled = [special, *tok("hi")["input_ids"], end]
    chat = [ASK, {"role": "assistant", "content": "", "token_ids": sampled}, {"role": "user", "content": "Again?"},
            {**NOON, "token_ids": [*tok("Noon.")["input_ids"], end]}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, token_exact=True, end_ids=frozenset({end}))
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [sampled, chat[-1]["token_ids"]]


def test_a_template_leaving_the_last_turn_open_bounds_an_earlier_turn_written_otherwise(random_llama):
    """A template that leaves the last message open (Kimi-K2-Instruct-0905's) and drops the thinking of
    earlier turns (Qwen3's): the earlier turn is bounded by the user turn after it, though the render
    the conversation is masked on ends with the stop token added for the open last turn. Unbounded, it
    looked for its thinking up to the end, found it in the last turn (the same "Let me think."), and
    trained the user turn between (until 2026-12-06)."""
    tok = templated(random_llama, "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                                  "{% if m['reasoning_content'] and loop.last %}<think>\n{{ m['reasoning_content'] }}\n"
                                  "</think>\n\n{% endif %}{{ m['content'] }}{% if not loop.last or add_generation_prompt %}"
                                  "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    answer = {"role": "assistant", "content": "Yes.", "reasoning_content": "Let me think."}
    chat = [{"role": "user", "content": "Is it?"}, answer, {"role": "user", "content": "Sure?"}, answer]
    assert masked(tok, chat) == ["Yes.<|im_end|>", "<think>\nLet me think.\n</think>\n\nYes.<|im_end|>"]
