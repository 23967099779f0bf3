"""Reasoning models: thinking kept apart from the answer (`reasoning_content`, or vLLM's `reasoning`)
is read, rendered by the target's chat template where it shows thinking, masked with the answer,
placed token for token, and counted where the template leaves it out."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from data_helpers import write_jsonl
from test_data_chat import spans, word_by_word

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.chat import dropped_reasoning, encode_conversation
from drafter_lab.data.conversations import Conversation, content_id, read_conversations
from drafter_lab.data.regenerate import answer_fields, regenerate
from drafter_lab.targets.hf import load_target, load_tokenizer

# A thinking template in the manner of Qwen3's: an assistant turn after the last user turn shows its
# reasoning (`reasoning_content`, or the part of its content before `</think>`) in a think block
# before the answer, an empty one for the last turn without any; earlier turns show the answer alone.
# With `enable_thinking` false, the generation prompt ends in an empty think block (the hybrid
# model's thinking off).
THINKING = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}"
    "{% set answer = m['content'] %}{% set thought = m['reasoning_content'] | default('') %}"
    "{% if '</think>' in answer %}{% set thought = answer.split('</think>')[0].split('<think>')[-1] %}"
    "{% set answer = answer.split('</think>')[-1] %}{% endif %}"
    "{% if loop.index0 > ns.last_user and (thought or loop.last) %}<think>\n{{ thought.strip('\\n') }}\n</think>\n\n{% endif %}"
    "{{ answer.lstrip('\\n') }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
THOUGHT = "They ask about join.\nIt glues path parts with the separator."
ANSWER = "It joins path parts."
ASKED = [{"role": "system", "content": "You explain Python source."},
         {"role": "user", "content": "What does os.path.join do?"}]


def thinking_tokenizer(random_llama):
    tok = load_tokenizer(random_llama)
    tok.chat_template = THINKING
    return tok


def test_reads_either_name_and_a_null_answer(tmp_path):
    rows = [{"id": "sglang", "conversations": [*ASKED, {"role": "assistant", "content": ANSWER,
                                                      "reasoning_content": THOUGHT}]},
            {"id": "vllm", "conversations": [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning": THOUGHT}]},
            {"id": "cut", "conversations": [*ASKED, {"role": "assistant", "content": None, "reasoning": THOUGHT}]},
            {"id": "none", "conversations": [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning": None,
                                                      "reasoning_content": ""}]},
            {"id": "empty", "conversations": [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": "",
                                                       "reasoning": THOUGHT}]}]
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    turns = [c.messages[-1] for c in convs]
    assert turns[0] == turns[1] == {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    assert turns[2] == {"role": "assistant", "content": "", "reasoning_content": THOUGHT}
    assert turns[3] == {"role": "assistant", "content": ANSWER}
    assert turns[4] == turns[0]  # an empty name does not hide the thinking under the next
    # The id of a conversation without reasoning is what it always was; reasoning tells two apart.
    plain = [*ASKED, {"role": "assistant", "content": ANSWER}]
    blob = json.dumps([[m["role"], m["content"]] for m in plain], ensure_ascii=False)
    assert content_id(plain) == "sha256:" + hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert content_id(convs[0].messages) != content_id(plain)


def test_the_template_renders_the_thinking_and_it_trains_with_the_answer(random_llama):
    tok = thinking_tokenizer(random_llama)
    apart = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    inline = [*ASKED, {"role": "assistant", "content": f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"}]
    ids, mask = encode_conversation(tok, apart, max_length=10_000)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}<|im_end|>"]
    # As a server's parser splits it, or as the model wrote it: one sequence.
    inline_ids, inline_mask = encode_conversation(tok, inline, max_length=10_000)
    assert torch.equal(ids, inline_ids) and torch.equal(mask, inline_mask)
    assert dropped_reasoning(tok, apart) == (1, 0)
    # A template that shows no thinking (the plain chatml one) trains the answer alone, and says so.
    plain = load_tokenizer(random_llama)
    ids, mask = encode_conversation(plain, apart, max_length=10_000)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{ANSWER}<|im_end|>"]
    assert dropped_reasoning(plain, apart) == (1, 1)


def test_earlier_turns_show_their_answers_alone(random_llama):
    tok = thinking_tokenizer(random_llama)
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT},
            {"role": "user", "content": "And split?"},
            {"role": "assistant", "content": "It returns (head, tail).", "reasoning_content": "Split is the inverse."}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [
        f"{ANSWER}<|im_end|>", "<think>\nSplit is the inverse.\n</think>\n\nIt returns (head, tail).<|im_end|>"]
    assert dropped_reasoning(tok, chat) == (2, 1)


@pytest.mark.parametrize("cut", [False, True], ids=["answered", "cut-while-thinking"])
def test_token_exact_places_thinking_and_answer_as_sampled(random_llama, cut):
    """The server's ids hold the thinking and the answer (or the thinking alone, cut at max_tokens):
    they stand for everything the template wrote for the turn, up to its end-of-turn token."""
    tok = thinking_tokenizer(random_llama)
    written = f"<think>\n{THOUGHT}" if cut else f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
    sampled = word_by_word(tok, written)
    assert sampled != tok(written, add_special_tokens=False)["input_ids"]
    turn = {"role": "assistant", "content": "" if cut else ANSWER, "reasoning_content": THOUGHT,
            "token_ids": sampled + ([] if cut else [tok.eos_token_id])}
    end = frozenset({tok.eos_token_id})  # the end token a server's ids close with
    ids, mask = encode_conversation(tok, [*ASKED, turn], max_length=10_000, token_exact=True, end_ids=end)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, tok.eos_token_id]]
    head = tok(tok.apply_chat_template(ASKED, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    assert ids.tolist() == [*head, *sampled, tok.eos_token_id, *tok("\n", add_special_tokens=False)["input_ids"]]
    # Through a template that shows no thinking, the same ids go where the answer was.
    plain_ids, _ = encode_conversation(load_tokenizer(random_llama), [*ASKED, turn], max_length=10_000,
                                       token_exact=True, end_ids=end)
    assert torch.equal(plain_ids, ids)


def test_a_local_regeneration_replaces_the_old_thinking(random_llama):
    target = load_target(random_llama)
    conv = Conversation("c", [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}])
    (out,) = regenerate(target, [conv], max_new_tokens=4, show_progress=False)
    assert "reasoning_content" not in out.messages[-1] and out.messages[-1]["content"] != ANSWER
    assert conv.messages[-1]["reasoning_content"] == THOUGHT  # the input is left as it was


def test_think_tokens_marked_special_are_masked_with_the_rest(random_llama):
    """Some tokenizers mark `<think>` special: the mask runs to the target's end-of-turn token, not to
    the first special token (until 2026-12-02 it stopped at `<think>`)."""
    tok = thinking_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}<|im_end|>"]
    # Without them, the turn's last special token closes it: the same mask.
    assert torch.equal(encode_conversation(tok, chat, max_length=10_000)[1], mask)
    # Token-exact, the sampled ids (special think tokens and all) take the whole turn's place.
    sampled = word_by_word(tok, f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
    exact = [*ASKED, dict(chat[-1], token_ids=sampled)]
    ids, mask = encode_conversation(tok, exact, max_length=10_000, token_exact=True, end_ids=frozenset({tok.eos_token_id}))
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*sampled, tok.eos_token_id]]
    assert tok.decode(ids).count(THOUGHT) == 1


def test_a_local_regeneration_keeps_think_tags_a_tokenizer_marks_special(random_llama, monkeypatch):
    """Decoded without special tokens, such a tokenizer's answer lost its tags and its thinking ran into
    the answer, which a capture of the text then trained as one answer; the tags stay, and the
    template reads the thinking apart as from any inline answer."""
    tok = thinking_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    written = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
    ids = tok(written, add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == f"\n{THOUGHT}\n\n\n{ANSWER}"
    assert answer_fields(tok, text, ids) == {"content": written}
    plain = thinking_tokenizer(random_llama)  # tags as text: the text as decoded
    plain_ids = plain(written, add_special_tokens=False)["input_ids"]
    assert answer_fields(plain, plain.decode(plain_ids, skip_special_tokens=True), plain_ids) == {"content": written}
    target = load_target(random_llama)
    target.tokenizer = tok
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda t, prompts, g: [(text, ids)] * len(prompts))
    (conv,) = regenerate(target, [Conversation("c", [*ASKED, {"role": "assistant", "content": "Old."}])],
                         show_progress=False)
    assert conv.messages[-1]["content"] == written
    assert dropped_reasoning(tok, conv.messages) == (1, 0)
    ids, mask = encode_conversation(tok, conv.messages, max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"{written}<|im_end|>"]
