"""Templates that hide the thinking: DeepSeek-R1's (and QwQ's) cut every answer's thinking, whether
kept apart (`reasoning_content`) or inline up to `</think>`, while the generation prompt opens the
think block the target then writes; Kimi-K2.5's and Kimi-K2-Thinking's write an empty block for every
turn up to the last answer. A conversation's last turn trains as it was served: the generation
prompt, the thinking, `</think>` and the answer (until 2026-12-02 it trained on its answer alone, and
inline thinking after the released R1 template's `<think>\\n` prompt was refused; Kimi's trained the
empty block)."""

from __future__ import annotations

import pytest
import torch
from test_data_chat import spans, word_by_word
from test_data_reasoning import THINKING
from test_data_tools import CALL

from drafter_lab.data.chat import dropped_reasoning, encode_conversation, render
from drafter_lab.targets.hf import load_tokenizer

SPECIAL = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
# In the manner of DeepSeek-R1's released template: an assistant turn shows what follows its last
# `</think>`, and the generation prompt opens the thinking.
R1_MANNER = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% else %}<｜Assistant｜>{{ m['content'].split('</think>')[-1] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)
# The first DeepSeek-R1 distills' template wrote an answer as it was given, inline thinking and all
# but the prompt's opening tag.
R1_DISTILL = R1_MANNER.replace("{{ m['content'].split('</think>')[-1] }}", "{{ m['content'] }}")
# In the manner of DeepSeek-V3.1's: a turn after a user turn opens with an empty think block, and the
# generation prompt opens one only with `thinking` on.
V31_MANNER = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜></think>{{ m['content'].split('</think>')[-1] }}"
    "<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if thinking else '</think>' }}{% endif %}"
)
ASKED = [{"role": "system", "content": "You explain Python source."},
         {"role": "user", "content": "What does os.path.join do?"}]
THOUGHT, ANSWER = "They ask about join.\nIt glues parts with the separator.", "It joins path parts."
SERVED = f"{THOUGHT}\n</think>\n\n{ANSWER}<｜end▁of▁sentence｜>"


def templated(random_llama, template: str, special: list[str] = SPECIAL):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.chat_template = template
    return tok


def stops(tok, end: str = "<｜end▁of▁sentence｜>") -> frozenset[int]:
    return frozenset({tok.convert_tokens_to_ids(end)})


@pytest.mark.parametrize("turn", [
    {"content": ANSWER, "reasoning_content": THOUGHT},
    {"content": f"{THOUGHT}\n</think>\n\n{ANSWER}"},  # a local regeneration's text, after the prompt's <think>
    {"content": f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"},  # a dataset's, the opening tag kept
    {"content": f"\n<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"},  # ... after a stray newline
], ids=["split", "inline", "inline-opened", "inline-opened-late"])
@pytest.mark.parametrize("template", [R1_MANNER, R1_DISTILL], ids=["cut", "as-given"])
def test_the_last_turn_trains_its_thinking_as_served(random_llama, turn, template):
    tok = templated(random_llama, template)
    chat = [*ASKED, {"role": "assistant", **turn}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert tok.decode(ids) == render(tok, ASKED, True) + SERVED
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [SERVED]
    assert dropped_reasoning(tok, chat) == (1, 0)


def test_earlier_turns_train_their_answers_and_are_counted(random_llama):
    tok = templated(random_llama, R1_MANNER)
    chat = [*ASKED, {"role": "assistant", "content": "It joins.", "reasoning_content": "Short."},
            {"role": "user", "content": "And split?"},
            {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert tok.decode(ids) == render(tok, chat[:-1], True) + SERVED  # the earlier turn as the target saw it
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == ["It joins.<｜end▁of▁sentence｜>", SERVED]
    assert dropped_reasoning(tok, chat) == (2, 1)


@pytest.mark.parametrize("template", [R1_MANNER, THINKING], ids=["deepseek-r1", "qwen3"])
def test_inline_thinking_is_cut_from_earlier_turns_and_counted(random_llama, template):
    """Inline thinking (a local regeneration keeps it so) counts like thinking kept apart, and an earlier
    turn the template shows without it trains on its answer (until 2026-12-02 such a turn, after a
    prompt that is no prefix of the render, was refused, and its thinking went uncounted)."""
    tok = templated(random_llama, template)
    chat = [*ASKED, {"role": "assistant", "content": "<think>\nShort.\n</think>\n\nIt joins."},
            {"role": "user", "content": "Why </think> here?"},
            {"role": "assistant", "content": f"{THOUGHT}\n</think>\n\n{ANSWER}"}]
    kwargs = {"enable_thinking": False}  # Qwen3's prompt then is no prefix of the render either
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=frozenset({tok.eos_token_id}) | stops(tok),
                                    template_kwargs=kwargs)
    closer = "<｜end▁of▁sentence｜>" if template == R1_MANNER else "<|im_end|>"
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"It joins.{closer}", f"{THOUGHT}\n</think>\n\n{ANSWER}{closer}"]
    assert dropped_reasoning(tok, chat, kwargs) == (2, 1)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking-on", "thinking-off"])
def test_a_hybrid_template_opens_the_thinking_only_when_asked(random_llama, thinking):
    """DeepSeek-V3.1 thinks after `<think>` and writes `</think>` right after its thinking; with its
    thinking off the prompt closes the block, so a turn's thinking is not the target's to serve."""
    tok = templated(random_llama, V31_MANNER)
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    kwargs = {"thinking": thinking}
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok), template_kwargs=kwargs)
    shown = f"{THOUGHT}</think>{ANSWER}" if thinking else ANSWER
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{shown}<｜end▁of▁sentence｜>"]
    assert dropped_reasoning(tok, chat, kwargs) == (1, int(not thinking))


@pytest.mark.parametrize("split", [True, False], ids=["split", "inline"])
def test_token_exact_follows_the_prompt_that_opened_the_thinking(random_llama, split):
    """The sampled ids come right after the served prompt, `<think>\\n` and all (until 2026-12-02 they
    followed `<｜Assistant｜>`, a prompt the target never saw), whether a parser split the text or not."""
    tok = templated(random_llama, R1_MANNER)
    sampled = word_by_word(tok, f"{THOUGHT}\n</think>\n\n{ANSWER}")
    end = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    text = {"content": ANSWER, "reasoning_content": THOUGHT} if split else {"content": f"{THOUGHT}\n</think>\n\n{ANSWER}"}
    turn = {"role": "assistant", **text, "token_ids": [*sampled, end]}
    ids, mask = encode_conversation(tok, [*ASKED, turn], max_length=10_000, token_exact=True, end_ids=stops(tok))
    prompt = tok(render(tok, ASKED, True), add_special_tokens=False)["input_ids"]
    assert ids.tolist() == [*prompt, *sampled, end]
    assert torch.equal(mask, torch.arange(len(ids)) >= len(prompt))


@pytest.mark.parametrize("shown", ["<think>\n{{ m['reasoning_content'] }}\n</think>\n\n",
                                   "<think>{{ m['reasoning_content'] }}</think>"], ids=["as-served", "otherwise"])
def test_a_template_showing_the_thinking_is_left_as_it_renders(random_llama, shown):
    """A thinking-only template in Qwen3-2507's manner opens the block in its prompt and writes the last
    turn's thinking itself: its render is what was served, or as near as the lab can tell."""
    tok = templated(random_llama, R1_MANNER.replace(
        "{{ m['content'].split('</think>')[-1] }}", "{% if loop.last %}" + shown + "{% endif %}{{ m['content'] }}"))
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, _ = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert tok.decode(ids) == render(tok, chat)
    assert dropped_reasoning(tok, chat) == (1, 0)


def test_a_prompt_ending_in_another_tag_opens_no_thinking(random_llama):
    tok = templated(random_llama, R1_MANNER.replace("<think>\n{% endif %}", "<answer>\n{% endif %}"))
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{ANSWER}<｜end▁of▁sentence｜>"]
    assert dropped_reasoning(tok, chat) == (1, 1)


KIMI_SPECIAL = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>",
                "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"]
# In the manner of Kimi-K2-Thinking's template: the turns up to the last answer without calls show an
# empty think block, the later ones (a chain of calls after it) their thinking; the target opens the
# block itself.
K2_THINKING = (
    "{% set ns = namespace(answered=-1) %}{% for m in messages %}"
    "{% if m['role'] == 'assistant' and not m['tool_calls'] %}{% set ns.answered = loop.index0 %}{% endif %}"
    "{% endfor %}{% for m in messages %}<|im_{{ m['role'] if m['role'] != 'tool' else 'system' }}|>"
    "{{ m['role'] }}<|im_middle|>{% if m['role'] == 'assistant' %}<think>"
    "{% if loop.index0 > ns.answered %}{{ m['reasoning_content'] }}{% endif %}</think>{% endif %}{{ m['content'] }}"
    "{% if m['tool_calls'] %}<|tool_calls_section_begin|>{% for c in m['tool_calls'] %}"
    "{{ c['function']['name'] }}:{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "<|tool_calls_section_end|>{% endif %}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)
# Kimi-K2.5's opens the block in the prompt, or writes it empty with `thinking` off.
K25 = K2_THINKING[:-len("{% endif %}")] + "{{ '<think></think>' if thinking is false else '<think>' }}{% endif %}"
KIMI_SERVED = f"<think>{THOUGHT}</think>{ANSWER}<|im_end|>"


@pytest.mark.parametrize("turn", [
    {"content": ANSWER, "reasoning_content": THOUGHT},
    {"content": f"<think>{THOUGHT}</think>{ANSWER}"},  # K2-Thinking's as a local regeneration keeps it
    {"content": f"{THOUGHT}</think>{ANSWER}"},  # K2.5's, after its prompt's tag
], ids=["split", "inline", "inline-untagged"])
@pytest.mark.parametrize("template", [K2_THINKING, K25], ids=["k2-thinking", "k2.5"])
def test_kimi_fills_the_empty_think_block_of_the_last_answer(random_llama, template, turn):
    """The target wrote its thinking where the template writes `<think></think>`: K2-Thinking the whole
    block, K2.5 after its prompt's `<think>` (until 2026-12-02 both trained the empty block)."""
    tok = templated(random_llama, template, KIMI_SPECIAL)
    chat = [*ASKED, {"role": "assistant", **turn}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok, "<|im_end|>"))
    assert tok.decode(ids) == render(tok, ASKED, True).removesuffix("<think>") + KIMI_SERVED
    opened = "<think>" if template == K25 else ""  # the prompt wrote the tag: the target's text starts after it
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [KIMI_SERVED.removeprefix(opened)]
    assert dropped_reasoning(tok, chat) == (1, 0)


@pytest.mark.parametrize(("before", "half", "after"), [("", "\n", "\n\n"), ("\n", "", "\n")], ids=["qwen", "glm-4.5"])
def test_the_thinking_goes_inside_the_blocks_whitespace(random_llama, before, half, after):
    """An empty block is filled as templates write the thinking they show: between the halves of the
    whitespace inside it (Qwen's `<think>\\nR\\n</think>`), the whitespace around it kept (GLM-4.5's)."""
    def ws(s):  # written as an expression: a newline right after a block tag would be dropped
        return "{{ " + repr(s) + " }}"
    template = K2_THINKING.replace("<think>{% if", f"{ws(before)}<think>{ws(half)}{{% if").replace(
        "{% endif %}</think>", f"{{% endif %}}{ws(half)}</think>{ws(after)}")
    tok = templated(random_llama, template, KIMI_SPECIAL)
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok, "<|im_end|>"))
    assert "<think>" + 2 * half + "</think>" in render(tok, chat)  # the block the template writes is empty
    served = f"{before}<think>{half}{THOUGHT}{half}</think>{after}{ANSWER}<|im_end|>"
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [served]


@pytest.mark.parametrize("template", [K2_THINKING, K25], ids=["k2-thinking", "k2.5"])
def test_kimi_serves_the_answer_after_the_thinking_of_its_calls(random_llama, template):
    """A chain of calls keeps its thinking in the prompts the target saw while it ran, and hides it once
    the answer follows: the answer is served after that prompt, the chain's thinking in it, trained."""
    tok = templated(random_llama, template, KIMI_SPECIAL)
    chat = [*ASKED, {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [CALL]},
            {"role": "tool", "content": "2048"}, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok, "<|im_end|>"))
    head = render(tok, chat[:-1], True)
    assert "Look it up." not in render(tok, chat) and "Look it up." in head
    assert tok.decode(ids) == head.removesuffix("<think>") + KIMI_SERVED
    call = '<|tool_calls_section_begin|>stat:{"path": "setup.py"}<|tool_calls_section_end|><|im_end|>'
    opened = "" if template == K2_THINKING else "<think>"
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"<think>Look it up.</think>{call}".removeprefix(opened), KIMI_SERVED.removeprefix(opened)]
    assert dropped_reasoning(tok, chat) == (2, 0)


@pytest.mark.parametrize("thought", ["Short.", None], ids=["thought", "no-thinking-known"])
@pytest.mark.parametrize("template", [K2_THINKING, K25], ids=["k2-thinking", "k2.5"])
def test_kimi_earlier_answers_train_without_the_block_written_for_their_thinking(random_llama, template, thought):
    """Later prompts show an earlier answer's thinking as an empty block (K2.5's: `</think>` after the
    `<think>` its prompt opened); the target never wrote that, so the answer alone trains, counted
    (until 2026-12-02 the block trained: a drafter proposing `</think>` at once). A turn without
    thinking keeps the template's block: nothing says the target thought there."""
    tok = templated(random_llama, template, KIMI_SPECIAL)
    earlier = {"role": "assistant", "content": "It joins.", **({"reasoning_content": thought} if thought else {})}
    chat = [*ASKED, earlier, {"role": "user", "content": "And split?"},
            {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok, "<|im_end|>"))
    opened = "<think>" if template == K25 else ""  # by the prompt
    block = "" if thought else "<think></think>".removeprefix(opened)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{block}It joins.<|im_end|>",
                                                              KIMI_SERVED.removeprefix(opened)]
    assert dropped_reasoning(tok, chat) == ((2, 1) if thought else (1, 0))


def test_kimi_token_exact_earlier_answers_train_as_sampled(random_llama):
    """Token-exact, an earlier turn's sampled ids (its thinking in them) stand for all the template wrote
    for it, the empty block too, and all of them train."""
    tok = templated(random_llama, K2_THINKING, KIMI_SPECIAL)
    (end,) = ends = stops(tok, "<|im_end|>")
    first = word_by_word(tok, "<think>Short.</think>It joins.")
    last = word_by_word(tok, KIMI_SERVED.removesuffix("<|im_end|>"))
    chat = [*ASKED, {"role": "assistant", "content": "It joins.", "reasoning_content": "Short.", "token_ids": [*first, end]},
            {"role": "user", "content": "And split?"},
            {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "token_ids": [*last, end]}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, token_exact=True, end_ids=ends)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*first, end], [*last, end]]


def test_kimi_token_exact_ids_follow_the_prompt(random_llama):
    tok = templated(random_llama, K2_THINKING, KIMI_SPECIAL)
    sampled = word_by_word(tok, KIMI_SERVED.removesuffix("<|im_end|>"))
    (end,) = stops(tok, "<|im_end|>")
    turn = {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "token_ids": [*sampled, end]}
    ids, mask = encode_conversation(tok, [*ASKED, turn], max_length=10_000, token_exact=True, end_ids=stops(tok, "<|im_end|>"))
    prompt = tok(render(tok, ASKED, True), add_special_tokens=False)["input_ids"]
    assert ids.tolist() == [*prompt, *sampled, end]
    assert torch.equal(mask, torch.arange(len(ids)) >= len(prompt))


def test_kimi_k25_with_its_thinking_off_serves_the_answer_alone(random_llama):
    """The prompt closes the block itself: a turn's thinking is not what the target served."""
    tok = templated(random_llama, K25, KIMI_SPECIAL)
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    kwargs = {"thinking": False}
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok, "<|im_end|>"), template_kwargs=kwargs)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{ANSWER}<|im_end|>"]
    assert dropped_reasoning(tok, chat, kwargs) == (1, 1)
