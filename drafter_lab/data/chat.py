"""Chat template + loss mask: which tokens of a rendered conversation train the drafter.

The conversation is rendered once with the target's own chat template (text), then tokenized
with character offsets. Each assistant turn's text starts where the template's generation prompt
for that turn ends (render of the turns before it with `add_generation_prompt=True`, which the
full render starts with for every prefix-stable template). The masked tokens run from there up to
and including the first special token: the end-of-turn token (`<|im_end|>`, `<|eot_id|>`,
`<end_of_turn>`, `</s>`), which the drafter must learn to propose too. Role headers, user and
system turns stay unmasked. Templates that rewrite earlier turns (not prefix-stable) fall back to
finding the assistant text itself in the render.

Token-exact (`token_exact`): each assistant turn's text is replaced by the tokens the target
sampled (`token_ids`, kept by regeneration, locally or through a server that returns them) and the
text around it is tokenized piece by piece, so the first turn follows its prompt exactly as a server
tokenized and extended it. Re-tokenizing the whole text instead can split an answer into other
tokens than the target wrote (at temperature 1, most answers of the tiny pair), which a replay of
serving over the text cannot afford. Later turns follow the earlier answers as sampled, where the
server that wrote them was sent those answers as text and tokenized them again: exact for
single-turn data, an approximation past the first turn.
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


def _tokenize(tokenizer, text: str, at: int = 0) -> tuple[list[int], list[int]]:
    """Token ids of `text` and the character offset (plus `at`) where each starts."""
    try:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    except NotImplementedError:
        raise LabError("tokenizer gives no character offsets (a fast tokenizer is needed)") from None
    return list(enc["input_ids"]), [at + a for a, _ in enc["offset_mapping"]]


def _spliced(tokenizer, messages: list[dict], text: str, spans: list[tuple[int, int]],
             end_ids: frozenset[int]) -> tuple[list[int], list[int], list[bool]]:
    """Ids and starts of `text` with each assistant turn's text replaced by its `token_ids` (all
    starting at the turn's offset, so the span masks them), and which ids the target sampled. A
    trailing id in `end_ids` is the end token the sampling stopped at (a server returns it): the
    template writes its own."""
    ids: list[int] = []
    starts: list[int] = []
    sampled: list[bool] = []
    cursor = 0
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i, (start, _) in zip(turns, spans):
        m = messages[i]
        if "token_ids" not in m:
            raise LabError(f"assistant turn {i} has no token_ids: a token-exact capture needs the target's own "
                           "tokens (data prepare --regenerate, or data regenerate)")
        # Templates may trim an answer; the sampled ids stand for the whole of what was written.
        content = next((c for c in (m["content"], m["content"].strip()) if text.startswith(c, start)), None)
        if content is None:
            raise LabError(f"chat template rewrites assistant turn {i}: cannot place the target's own tokens")
        answer = m["token_ids"][:-1] if m["token_ids"] and m["token_ids"][-1] in end_ids else m["token_ids"]
        if any(t >= len(tokenizer) for t in answer):
            raise LabError(f"assistant turn {i} holds token ids past the tokenizer's {len(tokenizer)}")
        piece, at = _tokenize(tokenizer, text[cursor:start], cursor)
        ids += piece + answer
        starts += at + [start] * len(answer)
        sampled += [False] * len(piece) + [True] * len(answer)
        cursor = start + len(content)
    piece, at = _tokenize(tokenizer, text[cursor:], cursor)
    return ids + piece, starts + at, sampled + [False] * len(piece)


def encode_conversation(tokenizer, messages: list[dict], max_length: int, token_exact: bool = False,
                        end_ids: frozenset[int] = frozenset()) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (LongTensor[T]) and loss mask (BoolTensor[T], True on assistant tokens), T <= max_length;
    `token_exact`: assistant turns as their `token_ids`, less a trailing end token (one of `end_ids`)."""
    text = render(tokenizer, messages)
    spans = assistant_char_spans(tokenizer, messages, text)
    if token_exact:
        ids, starts, sampled = _spliced(tokenizer, messages, text, spans, end_ids)
    else:
        ids, starts = _tokenize(tokenizer, text)
        sampled = [False] * len(ids)
    special = special_token_ids(tokenizer)
    mask = [False] * len(ids)
    for start, stop in spans:
        t = bisect.bisect_left(starts, start)
        while t < len(ids) and starts[t] < stop:
            mask[t] = True
            if ids[t] in special and not sampled[t]:  # the template's end-of-turn token closes the span
                break
            t += 1
    ids, mask = ids[:max_length], mask[:max_length]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)
