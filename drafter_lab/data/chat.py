"""Chat template + loss mask: which tokens of a rendered conversation train the drafter.

The conversation is rendered once with the target's own chat template (text), then tokenized
with character offsets. Each assistant turn's text starts where the template's generation prompt
for that turn ends (render of the turns before it with `add_generation_prompt=True`, which the
full render starts with for every prefix-stable template). The masked tokens run from there up to
and including the first special token: the end-of-turn token (`<|im_end|>`, `<|eot_id|>`,
`<end_of_turn>`, `</s>`), which the drafter must learn to propose too. Role headers, user and
system turns stay unmasked. Templates that rewrite earlier turns (not prefix-stable) fall back to
finding the assistant text itself in the render.
"""

from __future__ import annotations

import bisect

import torch

from drafter_lab.errors import LabError


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as e:  # jinja raises its own errors (e.g. "roles must alternate")
        raise LabError(f"chat template rejects the conversation: {str(e).splitlines()[0][:200]}") from None


def special_token_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def assistant_char_spans(tokenizer, messages: list[dict], text: str) -> list[tuple[int, int]]:
    """Per assistant turn, (start of its text, end of its region) as character offsets in `text`."""
    spans = []
    cursor = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = render(tokenizer, messages[:i], add_generation_prompt=True) if i else None
        if head is not None and text.startswith(head) and len(head) >= cursor:
            start = after = len(head)
        else:
            answer = m["content"].strip()
            start = text.find(answer, cursor)
            if start < 0:
                raise LabError(
                    f"chat template drops or rewrites assistant turn {i}; cannot place its loss mask"
                )
            after = start + len(answer)
        upto = render(tokenizer, messages[: i + 1])
        if text.startswith(upto) and len(upto) > start:
            stop = after = len(upto)
        else:  # the end-of-turn token alone closes the span
            stop = len(text)
        spans.append((start, stop))
        cursor = after
    return spans


def encode_conversation(tokenizer, messages: list[dict], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (LongTensor[T]) and loss mask (BoolTensor[T], True on assistant tokens), T <= max_length."""
    text = render(tokenizer, messages)
    try:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    except NotImplementedError:
        raise LabError("tokenizer gives no character offsets (a fast tokenizer is needed)") from None
    ids = list(enc["input_ids"])
    starts = [a for a, _ in enc["offset_mapping"]]
    special = special_token_ids(tokenizer)
    mask = [False] * len(ids)
    for start, stop in assistant_char_spans(tokenizer, messages, text):
        t = bisect.bisect_left(starts, start)
        while t < len(ids) and starts[t] < stop:
            mask[t] = True
            if ids[t] in special:  # the end-of-turn token closes the span
                break
            t += 1
    ids, mask = ids[:max_length], mask[:max_length]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)
