"""GPT-OSS's harmony format: thinking is read from a dataset's `thinking` and handed to the template
under that name; the last turn's analysis and final channels train up to `<|return|>`, and an earlier
turn, which the template closes with `<|end|>` where its own render has `<|return|>`, trains its
final channel up to that `<|end|>` (until 2026-12-02 its mask held one token)."""

from __future__ import annotations

import pytest
from data_helpers import write_jsonl
from test_data_chat import spans, word_by_word

from drafter_lab.data.chat import dropped_reasoning, encode_conversation, render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.targets.hf import load_tokenizer

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
    assert seen[0][-1]["thinking"] == THOUGHT  # whatever transformers version adds or not
    assert f"<|channel|>analysis<|message|>{THOUGHT}<|end|>" in text
    assert dropped_reasoning(harmony, conv.messages) == (1, 0)


def test_the_last_turn_trains_analysis_and_final_up_to_return(harmony):
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"]


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
    assert seen[0][-1] == {"role": "assistant", "content": ANSWER}


def test_a_template_writing_the_next_message_twice_falls_back_to_the_whole_text(harmony):
    """Message 3's text also heads the render: the marked render differs from the real one by more
    than the replacement, so the turn is not bounded by the first marker (the header)."""
    harmony.chat_template = "{% if messages | length > 3 %}{{ messages[3]['content'] }}|{% endif %}" + HARMONY
    chat = [*ASKED, {"role": "assistant", "content": ANSWER}, *LATER]
    ids, mask = encode_conversation(harmony, chat, max_length=10_000, end_ids=returns(harmony))
    # No render is a prefix of another here: the turn starts at its answer's text (chat.py's fallback).
    assert [harmony.decode(ids[a:b]) for a, b in spans(mask)][0] == f"{ANSWER}<|end|>"
