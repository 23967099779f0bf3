"""Loss masks: assistant text plus its end-of-turn token, nothing else, on multi-turn chats."""

from __future__ import annotations

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


def test_template_that_is_not_prefix_stable(random_llama):
    tok = load_tokenizer(random_llama)
    tok.chat_template = LENGTH_HEADER
    ids, mask = encode_conversation(tok, MESSAGES, max_length=10_000)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + "<|im_end|>" for a in ANSWERS]


def test_template_that_rewrites_answers_is_refused(random_llama):
    tok = load_tokenizer(random_llama)
    tok.chat_template = LENGTH_HEADER.replace("{{ m['content'] }}", "{{ m['content'] | upper }}")
    with pytest.raises(LabError, match="chat template drops or rewrites assistant turn 2"):
        encode_conversation(tok, MESSAGES, max_length=10_000)
