"""Templates that hide the thinking: DeepSeek-R1's (and QwQ's) cut every answer's thinking, whether
kept apart (`reasoning_content`) or inline up to `</think>`, while the generation prompt opens the
think block the target then writes. A conversation's last turn trains as it was served: the
generation prompt, the thinking, `</think>` and the answer (until 2026-12-02 it trained on its answer
alone, and inline thinking after the released template's `<think>\\n` prompt was refused)."""

from __future__ import annotations

import pytest
import torch
from test_data_chat import spans, word_by_word
from test_data_reasoning import THINKING

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


def deepseek(random_llama, template: str):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = template
    return tok


def stops(tok) -> frozenset[int]:
    return frozenset({tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")})


@pytest.mark.parametrize("turn", [
    {"content": ANSWER, "reasoning_content": THOUGHT},
    {"content": f"{THOUGHT}\n</think>\n\n{ANSWER}"},  # a local regeneration's text, after the prompt's <think>
    {"content": f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"},  # a dataset's, the opening tag kept
], ids=["split", "inline", "inline-opened"])
@pytest.mark.parametrize("template", [R1_MANNER, R1_DISTILL], ids=["cut", "as-given"])
def test_the_last_turn_trains_its_thinking_as_served(random_llama, turn, template):
    tok = deepseek(random_llama, template)
    chat = [*ASKED, {"role": "assistant", **turn}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert tok.decode(ids) == render(tok, ASKED, True) + SERVED
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [SERVED]
    assert dropped_reasoning(tok, chat) == (1, 0)


def test_earlier_turns_train_their_answers_and_are_counted(random_llama):
    tok = deepseek(random_llama, R1_MANNER)
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
    tok = deepseek(random_llama, template)
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
    tok = deepseek(random_llama, V31_MANNER)
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
    tok = deepseek(random_llama, R1_MANNER)
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
    tok = deepseek(random_llama, R1_MANNER.replace(
        "{{ m['content'].split('</think>')[-1] }}", "{% if loop.last %}" + shown + "{% endif %}{{ m['content'] }}"))
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, _ = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert tok.decode(ids) == render(tok, chat)
    assert dropped_reasoning(tok, chat) == (1, 0)


def test_a_prompt_ending_in_another_tag_opens_no_thinking(random_llama):
    tok = deepseek(random_llama, R1_MANNER.replace("<think>\n{% endif %}", "<answer>\n{% endif %}"))
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=stops(tok))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{ANSWER}<｜end▁of▁sentence｜>"]
    assert dropped_reasoning(tok, chat) == (1, 1)
