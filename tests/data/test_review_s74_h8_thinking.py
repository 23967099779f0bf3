"""Multi-turn conversations of a thinking model whose template cuts earlier turns' thinking (DeepSeek-R1's,
Qwen3's) or writes it after its prompt's `<think>\\n` (R1's distills). Token-exact, an earlier turn whose
thinking is inline in its content (a local regeneration's "R\\n</think>\\n\\nA", a dataset's
"<think>\\nR...") has its ids stand for all the template wrote for the turn, as thinking kept apart does;
until 2026-12-07 it was refused ("chat template rewrites assistant turn 2": its whole content was looked
for where the template wrote the answer alone), so token-exact `--turns each` skipped such conversations.
With the last turn written as served, an earlier turn is placed in its own turn, not in a user message
that holds its answer, and its mask does not depend on whether the last turn thinks."""

from __future__ import annotations

import pytest
import torch
from test_data_chat import spans, word_by_word
from test_data_hidden_thinking import ANSWER, ASKED, R1_DISTILL, R1_MANNER, THOUGHT, stops, templated
from test_data_reasoning import THINKING

from drafter_lab.data.chat import TemplateRefusal, encode_conversation, render

END = "<｜end▁of▁sentence｜>"

FIRST = "Short.\n</think>\n\nIt joins."
"""The earlier answer as R1 sampled it after its prompt's `<think>\\n`: thinking, `</think>`, answer."""
LAST = f"{THOUGHT}\n</think>\n\n{ANSWER}"


def chat(tok, end: int, first: dict) -> tuple[list[dict], list[int], list[int]]:
    """The conversation with `first` as its earlier turn, and the ids sampled for each turn (not as
    whole-text tokenization splits them)."""
    one, two = word_by_word(tok, FIRST), word_by_word(tok, LAST)
    return ([*ASKED, {"role": "assistant", **first, "token_ids": [*one, end]}, {"role": "user", "content": "And split?"},
             {"role": "assistant", "content": LAST, "token_ids": [*two, end]}], one, two)


def closer(tok, template: str) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>" if template == THINKING else "<｜end▁of▁sentence｜>")


@pytest.mark.parametrize("content", [FIRST, f"<think>\n{FIRST}"], ids=["inline", "inline-opened"])
@pytest.mark.parametrize("template", [R1_MANNER, THINKING], ids=["deepseek-r1", "qwen3"])
def test_an_earlier_turns_inline_thinking_the_template_cuts_trains_as_sampled(random_llama, template, content):
    tok = templated(random_llama, template)
    end = closer(tok, template)
    ends = frozenset({end})
    messages, one, two = chat(tok, end, {"content": content})
    ids, mask = encode_conversation(tok, messages, 10_000, token_exact=True, end_ids=ends)
    (a, b), (c, d) = spans(mask)
    assert [ids[a:b].tolist(), ids[c:d].tolist()] == [[*one, end], [*two, end]]
    # The earlier ids stand for all the template wrote for the turn after its header (R1's `\n\n` left
    # by the cut too): one sequence, whether a parser split the thinking or the model's text kept it.
    header = "<｜Assistant｜>" if template == R1_MANNER else "<|im_start|>assistant\n"
    assert tok.decode(ids[:a]) == render(tok, ASKED) + header
    split, _, _ = chat(tok, end, {"content": "It joins.", "reasoning_content": "Short."})
    assert [t.tolist() for t in encode_conversation(tok, split, 10_000, token_exact=True, end_ids=ends)] == \
        [ids.tolist(), mask.tolist()]


def test_an_earlier_turn_written_after_the_prompts_think_tag_follows_it_as_served(random_llama):
    """R1's distills write an answer as given: a dataset's `<think>\\n` opening it is where their prompt
    wrote it, so the earlier turn's ids follow that prompt exactly, as the target sampled them."""
    tok = templated(random_llama, R1_DISTILL)
    end = closer(tok, R1_DISTILL)
    messages, one, two = chat(tok, end, {"content": f"<think>\n{FIRST}"})
    ids, mask = encode_conversation(tok, messages, 10_000, token_exact=True, end_ids=stops(tok))
    prompt = tok(render(tok, ASKED, True), add_special_tokens=False)["input_ids"]
    assert ids[:len(prompt) + len(one) + 1].tolist() == [*prompt, *one, end]
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*one, end], [*two, end]]


@pytest.mark.parametrize("content", [FIRST, f"<think>\n{FIRST}"], ids=["inline", "inline-opened"])
def test_last_only_reads_the_earlier_turn_as_the_template_writes_it(random_llama, content):
    """`--turns last`: the earlier turn is prompt, its thinking cut as the server that sampled the last
    turn was sent it, and the last turn's ids follow that prompt's `<think>\\n`: exact."""
    tok = templated(random_llama, R1_MANNER)
    end = closer(tok, R1_MANNER)
    messages, _, two = chat(tok, end, {"content": content})
    ids, mask = encode_conversation(tok, messages, 10_000, token_exact=True, end_ids=stops(tok), last_only=True)
    prompt = tok(render(tok, messages[:-1], True), add_special_tokens=False)["input_ids"]
    assert "Short." not in tok.decode(prompt)
    assert ids.tolist() == [*prompt, *two, end]
    assert torch.equal(mask, torch.arange(len(ids)) >= len(prompt))


def test_a_rewritten_answer_after_inline_thinking_is_refused_without_an_end_token(random_llama):
    """The turn is placed up to its end-of-turn token, as split thinking is: a template that writes none
    still has it refused, not its ids put anywhere."""
    tok = templated(random_llama, "{% for m in messages %}{{ m['role'] }}: {{ m['content'].split('</think>')[-1] }}"
                                  "\n{% endfor %}")
    turn = {"role": "assistant", "content": "Greet.</think>Hello.", "token_ids": word_by_word(tok, "Greet.</think>Hello.")}
    with pytest.raises(TemplateRefusal, match="^chat template rewrites assistant turn 1: cannot place"):
        encode_conversation(tok, [{"role": "user", "content": "Hi"}, turn], 4096, token_exact=True)


@pytest.mark.parametrize("exact", [False, True], ids=["text", "token-exact"])
def test_an_earlier_answer_a_user_message_holds_is_placed_in_its_own_turn(random_llama, exact):
    """With the last turn written as served, the earlier turn was looked for by its answer from the
    top: found in the user's "Reply: It joins.", that text was masked, and token-exact the sampled ids
    took its place (the template's own answer lost). It is placed in its own turn."""
    tok = templated(random_llama, R1_MANNER)
    end = closer(tok, R1_MANNER)
    one, two = word_by_word(tok, FIRST), word_by_word(tok, LAST)
    chat = [{"role": "user", "content": "Reply: It joins."},
            {"role": "assistant", "content": "It joins.", "reasoning_content": "Short.", "token_ids": [*one, end]},
            {"role": "user", "content": "And split?"},
            {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT, "token_ids": [*two, end]}]
    ids, mask = encode_conversation(tok, chat, 10_000, token_exact=exact, end_ids=stops(tok))
    first = FIRST if exact else "It joins."
    assert tok.decode(ids) == f"<｜User｜>Reply: It joins.<｜Assistant｜>{first}{END}<｜User｜>And split?" \
                              f"<｜Assistant｜><think>\n{LAST}{END}"
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{first}{END}", f"{LAST}{END}"]


@pytest.mark.parametrize("last", [{"content": LAST}, {"content": ANSWER}], ids=["thinking", "answer-alone"])
def test_an_earlier_turns_cut_thinking_leaves_no_whitespace_in_its_mask(random_llama, last):
    """R1's template writes what follows an earlier turn's `</think>`, `\n\n` and all: the answer trains,
    not that whitespace, whether or not the last turn thinks (it did only where it did not)."""
    tok = templated(random_llama, R1_MANNER)
    chat = [*ASKED, {"role": "assistant", "content": f"<think>\n{FIRST}"}, {"role": "user", "content": "And split?"},
            {"role": "assistant", **last}]
    ids, mask = encode_conversation(tok, chat, 10_000, end_ids=stops(tok))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)][0] == f"It joins.{END}"
