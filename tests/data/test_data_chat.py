"""Loss masks: assistant text plus its end-of-turn token, nothing else, on multi-turn chats."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from drafter_lab.data.chat import encode_conversation, render
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

MESSAGES = [
    {"role": "system", "content": "You explain Python source."},
    {"role": "user", "content": "What does os.path.join do?"},
    {"role": "assistant", "content": "It joins path parts:\n    os.path.join('a', 'b') == 'a/b'"},
    {"role": "user", "content": "And  split?"},
    {"role": "assistant", "content": "It returns (head, tail)."},
    {"role": "user", "content": "Thanks."},
]
ANSWERS = [m["content"] for m in MESSAGES if m["role"] == "assistant"]

# Other template shapes: a role header that itself holds a special token and trims content
# (Llama-3-like), and one with no role header at all (Mistral-like).
HEADER_WITH_SPECIAL = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}<|endoftext|>\n\n{{ m['content'] | trim }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant<|endoftext|>\n\n{% endif %}"
)
NO_HEADER = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|>"
    "{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}"
)


def spans(mask: torch.Tensor) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(mask.tolist() + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def templated(random_llama, template: str):
    """The random Llama's tokenizer under `template`."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = template
    return tok


def masked(tok, ids, mask) -> list[str]:
    """The decoded runs of masked tokens."""
    return [tok.decode(ids[a:b]) for a, b in spans(mask)]


@pytest.mark.parametrize("template", [None, HEADER_WITH_SPECIAL, NO_HEADER], ids=["chatml", "special-header", "no-header"])
def test_mask_covers_each_assistant_turn_and_its_end_token(random_llama, template):
    tok = load_tokenizer(random_llama)
    if template is not None:
        tok.chat_template = template
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    found = spans(mask)
    assert len(found) == len(ANSWERS)
    for (a, b), answer in zip(found, ANSWERS):
        want = answer.strip() if template == HEADER_WITH_SPECIAL else answer
        assert tok.decode(ids[a:b]) == want + "<|im_end|>"
        assert int(ids[b - 1]) == tok.eos_token_id
    # The unmasked rest is exactly the template text without the assistant answers.
    text = render(tok, MESSAGES)
    for answer in ANSWERS:
        want = answer.strip() if template == HEADER_WITH_SPECIAL else answer
        text = text.replace(want + "<|im_end|>", "", 1)
    assert tok.decode(ids[~mask]) == text


# A template closing assistant turns with a special token the target does not stop at (as Gemma's
# `<end_of_turn>` where generation_config lists only `<eos>`, or harmony's `<|end|>`), and one that
# writes a special token after the last turn (as Phi-3's `<|endoftext|>`).
OTHER_CLOSER = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|endoftext|>{% else %}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAILER = NO_TRAILER = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAILER += "{% if not add_generation_prompt %}<|endoftext|>{% endif %}"


@pytest.mark.parametrize(("template", "closer"), [(OTHER_CLOSER, "<|endoftext|>"), (TRAILER, "<|im_end|>"),
                                                  (NO_TRAILER, "<|im_end|>")], ids=["other-closer", "trailer", "plain"])
def test_a_turn_ends_at_the_targets_end_token_else_its_last_special_token(random_llama, template, closer):
    tok = load_tokenizer(random_llama)
    tok.chat_template = template
    ids, mask = encode_conversation(tok, MESSAGES[:-1], max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + closer for a in ANSWERS]


# In the manner of Kimi-K2-Instruct-0905's template: a message is closed only once another follows (or
# the generation prompt), so that the last assistant message can be continued (prefill).
OPEN_LAST = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if not loop.last or add_generation_prompt %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("last", ["assistant", "user"])
def test_a_turn_the_template_closes_only_once_another_follows_trains_its_end_token(random_llama, last):
    """Each turn's own render lacks `<|im_end|>`: the one the whole render has right after it is the
    turn's, and the last turn, left open, is closed with the one the template writes once the
    conversation goes on, as the target ends that answer (until 2026-12-02 no turn trained it)."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = OPEN_LAST
    (end,) = ends = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    chat = MESSAGES[:-1] if last == "assistant" else MESSAGES
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=ends)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + "<|im_end|>" for a in ANSWERS]
    assert tok.decode(ids).endswith("<|im_end|>" if last == "assistant" else "Thanks.")
    sampled = [dict(m, token_ids=[*word_by_word(tok, m["content"]), end]) if m["role"] == "assistant" else m
               for m in chat]
    ids, mask = encode_conversation(tok, sampled, max_length=10_000, token_exact=True, end_ids=ends)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [m["token_ids"] for m in sampled if m["role"] == "assistant"]
    ids, mask = encode_conversation(tok, chat, max_length=10_000)  # no end token known: none added
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)][-1] == ANSWERS[-1]


def test_no_end_token_is_taken_from_a_render_that_writes_the_last_turn_otherwise(random_llama):
    """Asked to go on, this template writes the last answer's tail otherwise, with `<|im_end|>` where
    the training render ends: that render does not go on from this one, so nothing is added."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = OPEN_LAST.replace(
        "{% if not loop.last or add_generation_prompt %}<|im_end|>\n{% endif %}",
        "{% if not loop.last %}<|im_end|>\n{% elif add_generation_prompt %}abcdefghij<|im_end|>\n"
        "{% else %}0123456789{% endif %}")
    ids, mask = encode_conversation(tok, MESSAGES[:-1], max_length=10_000,
                                    end_ids=frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))
    assert tok.decode(ids).endswith(f"{ANSWERS[-1]}0123456789")


def test_truncation_keeps_a_prefix(random_llama):
    tok = load_tokenizer(random_llama)
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000)
    k = int(torch.nonzero(mask)[3]) + 1  # cut inside the first answer
    short_ids, short_mask = encode_conversation(tok, MESSAGES, max_length=k)
    assert torch.equal(short_ids, ids[:k]) and torch.equal(short_mask, mask[:k])


def test_target_without_template_gets_default_with_warning(random_llama, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(random_llama, bare)
    (bare / "chat_template.jinja").unlink()
    with pytest.warns(UserWarning, match="no chat template; using the default ChatML template"):
        tok = load_tokenizer(bare)
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000)
    assert render(tok, MESSAGES).startswith("<|im_start|>system\nYou explain Python source.<|im_end|>\n")
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + "<|im_end|>" for a in ANSWERS]


# A header that changes with the conversation length: no render is a prefix of another, so the
# assistant text has to be found in the full render instead.
LENGTH_HEADER = "<|im_start|>{{ messages | length }} turns\n" + (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("other_closer", [False, True])
def test_template_that_is_not_prefix_stable(random_llama, other_closer):
    """Such a turn's region runs on past it, so its mask ends at its first special token, even where
    this template closes assistant turns with another than the target's end token (harmony's `<|end|>`)
    and a later turn holds that one."""
    tok = load_tokenizer(random_llama)
    closer = "<|endoftext|>" if other_closer else "<|im_end|>"
    tok.chat_template = LENGTH_HEADER.replace(
        "{{ m['content'] }}<|im_end|>",
        "{{ m['content'] }}{% if m['role'] == 'assistant' %}" + closer + "{% else %}<|im_end|>{% endif %}")
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + closer for a in ANSWERS]


def test_a_turn_is_placed_after_the_message_before_it_where_no_render_is_a_prefix(random_llama):
    """A template that rewrites every message (capitals) and whose renders are not prefixes of one
    another: each turn starts past the message before it (located by a marker, which capitals leave
    as it is) and the generation prompt, and trains on the answer as the template writes it."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = LENGTH_HEADER.replace("{{ m['content'] }}", "{{ m['content'] | upper }}")
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a.upper() + "<|im_end|>" for a in ANSWERS]


def test_template_that_drops_a_turn_is_refused(random_llama):
    tok = load_tokenizer(random_llama)
    tok.chat_template = LENGTH_HEADER.replace("{% for m in messages %}", "{% for m in messages %}"
                                              "{% if m['role'] == 'assistant' and not loop.last %}{% continue %}{% endif %}")
    with pytest.raises(LabError, match="chat template drops or rewrites assistant turn 2"):
        encode_conversation(tok, MESSAGES, max_length=10_000)


def test_an_earlier_answer_is_looked_for_before_the_next_message_only(random_llama):
    """A template that writes earlier answers otherwise (here in capitals): the answer is not where
    the turn is, and the same words in the next user turn must not stretch the mask over it."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = [{"role": "user", "content": "Is it?"}, {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "yes, and then?"}, {"role": "assistant", "content": "Then more."}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, end_ids=frozenset({tok.eos_token_id}))
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == ["YES<|im_end|>", "Then more.<|im_end|>"]
    # Token-exact, the target's "yes" has no place: not the user's "yes" either.
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m for m in chat]
    with pytest.raises(LabError, match="chat template rewrites assistant turn 1"):
        encode_conversation(tok, exact, max_length=10_000, token_exact=True, end_ids=frozenset({tok.eos_token_id}))


def word_by_word(tok, text: str) -> list[int]:
    """Ids of `text` tokenized one word (and one run of spaces) at a time: a split of the same text
    that whole-text tokenization does not give, as a target's sampled tokens often are not."""
    return [i for w in re.split(r"(\s+)", text) if w for i in tok(w, add_special_tokens=False)["input_ids"]]


@pytest.mark.parametrize("template", [None, HEADER_WITH_SPECIAL, NO_HEADER, LENGTH_HEADER],
                         ids=["chatml", "special-header", "no-header", "not-prefix-stable"])
def test_token_exact_masks_the_sampled_tokens_and_tokenizes_the_rest_around_them(random_llama, template):
    tok = load_tokenizer(random_llama)
    if template is not None:
        tok.chat_template = template
    written = [ANSWERS[0], ANSWERS[1] + " \n"]  # the target also wrote a trailing newline, which a template may trim
    sampled = [word_by_word(tok, a) for a in written]
    assert any(s != tok(a, add_special_tokens=False)["input_ids"] for s, a in zip(sampled, written))
    answers = iter(zip(written, sampled))
    messages = [dict(m, **dict(zip(("content", "token_ids"), next(answers)))) if m["role"] == "assistant" else m
                for m in MESSAGES]
    ids, mask = encode_conversation(tok, messages, max_length=10_000, token_exact=True)
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [[*s, tok.eos_token_id] for s in sampled]
    plain_ids, plain_mask = encode_conversation(tok, MESSAGES, max_length=10_000)
    assert tok.decode(ids[~mask]) == tok.decode(plain_ids[~plain_mask])  # the same text around the answers
    if template is None:  # the first answer follows its prompt as a server tokenized it
        prompt = render(tok, MESSAGES[:2], add_generation_prompt=True)
        assert ids[:spans(mask)[0][0]].tolist() == tok(prompt, add_special_tokens=False)["input_ids"]
    short_ids, short_mask = encode_conversation(tok, messages, max_length=20, token_exact=True)
    assert torch.equal(short_ids, ids[:20]) and torch.equal(short_mask, mask[:20])


@pytest.mark.parametrize("template", [None, LENGTH_HEADER], ids=["chatml", "not-prefix-stable"])
def test_token_exact_keeps_a_special_token_the_target_sampled_inside_its_answer(random_llama, template):
    tok = load_tokenizer(random_llama)
    if template is not None:
        tok.chat_template = template
    inside = [*word_by_word(tok, ANSWERS[0]), tok.pad_token_id or 0, *word_by_word(tok, "more")]
    messages = [dict(m, token_ids=inside if i == 2 else word_by_word(tok, m["content"])) if m["role"] == "assistant"
                else m for i, m in enumerate(MESSAGES)]
    ids, mask = encode_conversation(tok, messages, max_length=10_000, token_exact=True)
    assert ids[spans(mask)[0][0]:spans(mask)[0][1]].tolist() == [*inside, tok.eos_token_id]


@pytest.mark.parametrize(("change", "message"), [
    ("drop", "assistant turn 4 has no token_ids: a token-exact capture needs the target's own tokens"),
    ("past vocab", "assistant turn 2 holds token ids past the tokenizer's"),
    ("rewriting template", "chat template rewrites assistant turn 2: cannot place the target's own tokens"),
])
def test_token_exact_refuses_turns_it_cannot_place(random_llama, change, message):
    tok = load_tokenizer(random_llama)
    messages = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m
                for m in MESSAGES]
    if change == "drop":
        del messages[4]["token_ids"]
    elif change == "past vocab":
        messages[2]["token_ids"] = [len(tok)]
    else:  # prefix-stable, so the answer's place is known, but its text is not what the target wrote
        tok.chat_template = HEADER_WITH_SPECIAL.replace("m['content'] | trim", "m['content'] | upper")
    with pytest.raises(LabError, match=message):
        encode_conversation(tok, messages, max_length=10_000, token_exact=True)
