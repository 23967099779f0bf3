"""Chat template + loss mask: which tokens of a rendered conversation train the drafter.

The conversation is rendered once with the target's own chat template (text), then tokenized
with character offsets. Each assistant turn's text starts where the template's generation prompt
for that turn ends (render of the turns before it with `add_generation_prompt=True`, which the
full render starts with for every prefix-stable template). The masked tokens run from there up to
and including the turn's end-of-turn token (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `</s>`),
which the drafter must learn to propose too: within the turn's own render, the first of the tokens
the target stops at, else the last special token the template wrote for the turn, so special
tokens inside it (a `<think>` some tokenizers mark special, harmony's channels) are masked like the
rest. A template that closes a message only once another follows (Kimi-K2-Instruct-0905's, which
leaves the last one open for prefill) has its stop token right after the turn's own render taken
as the turn's, and the conversation's last turn closed with the one it writes when asked to go on.
An answer cut at its token limit (`finish_reason` "length", regenerate.py) ends its mask with its own
last token: the target had not stopped, so the end-of-turn token the template writes after it is not
the target's (an answer without a `finish_reason` trains it, as before).
Role headers, user and system turns stay unmasked. Where the render of the turns before one is not
a prefix of the whole (GPT-OSS writes a tool call's analysis until a final answer follows), the
turn starts past the message before it (located by rendering with that message's text replaced by
a marker) and what that render writes after it; else where its own text is written (located
likewise: DeepSeek-R1's prompt opens a think block its earlier turns lack), else that text is looked
for. A turn the template writes otherwise once later turns follow (Qwen3 drops its thinking, harmony
closes it with `<|end|>` where its own render has `<|return|>`) runs up to the next message's text
written past it (located likewise; DeepSeek-V3 writes system turns at the top) and ends at the first
token the target stops at there (GPT-OSS's `<|call|>`), else at the first special token after its
answer.

Token-exact (`token_exact`): each assistant turn's text is replaced by the tokens the target
sampled (`token_ids`, kept by regeneration, locally or through a server that returns them) and the
text around it is tokenized piece by piece, so the first turn follows its prompt exactly as a server
tokenized and extended it. Re-tokenizing the whole text instead can split an answer into other
tokens than the target wrote (at temperature 1, most answers of the tiny pair), which a replay of
serving over the text cannot afford. Later turns follow the earlier answers as sampled, where the
server that wrote them was sent those answers as text and tokenized them again: exact for
single-turn data, an approximation past the first turn. `last_only` (`--turns last|each`) trains
the last turn alone, so the earlier ones are text, as that server read them: exact for every turn.

Reasoning (`reasoning_content`, conversations.py) goes to the template with the rest of the turn,
also as `thinking`, the name GPT-OSS's harmony template reads, or, to a template that writes thinking
from content parts alone (Mistral's), as a thinking part ahead of the answer's text: a thinking
model's template writes it inside the assistant turn (Qwen3: `<think>...</think>` before the answer,
for the turns after the last user turn; harmony: an analysis channel before the final one, for the
last turn; Magistral: `[THINK]...[/THINK]` before the answer, in every turn), so it is masked and
trains like the answer, and
token-exact, the sampled ids (thinking and answer, as a server returns them) stand for all the
template wrote for the turn up to its end-of-turn token (thinking kept apart or inline alike). A
template that hides the last turn's thinking where the generation prompt opens a think block
(DeepSeek-R1's `<think>\n`, Kimi-K2.5's `<think>`) or where it writes an empty one for the turn
(Kimi-K2-Thinking's `<think></think>`) has the conversation's last turn written as served
(`_as_served`): that prompt, the thinking and the answer, all masked. Where the template leaves it
out otherwise (earlier turns, or a template that never shows reasoning), `dropped_reasoning` counts
it, and an empty block written in its place (`HIDDEN_THINKING`, Kimi's) stays unmasked: the target
never wrote it.

Tool use (conversations.py): the conversation's `tools` go to every render, and an assistant turn's
`tool_calls` are written by the template inside the turn (Qwen's `<tool_call>` tags), so they are
masked and train like an answer; tool results are turns of their own, unmasked like user turns.
Token-exact, a turn's sampled ids stand for all the template wrote for it, calls included; a turn
of calls without ids (kept as recorded by regeneration) stays text and unmasked. A call's arguments
reach the template as an object, or as JSON text where it concatenates them (DeepSeek's, `render`).

Every render takes the template's extra variables (`template_kwargs`, the `chat_template_kwargs` of
an SGLang or vLLM request): a hybrid thinking model served with `{"enable_thinking": false}` gets
an empty think block at the end of its prompt (Qwen3), so the mask starts after it, as the tokens
the server samples do. A template that reads the clock (`strftime_now`: Llama 3.2's and 3.3's
"Today Date", Mistral Small 3.1's) renders the day the lab's own variable `template_date` names
(`pinned` picks it once per run, which records it with the others), not the day it runs.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import hashlib
import json
import os
import re
import threading
import weakref
from collections.abc import Iterable
from typing import NamedTuple

import torch

from drafter_lab.atomic import sha256_json
from drafter_lab.data.capture_config import (
    TEMPLATE_DATE,
    TEMPLATE_HASH,
    TOKENIZER_HASH,
    recorded_kwargs_problem,
    template_date,
    template_setting,
)
from drafter_lab.data.conversations import CUT, SAMPLING_FIELDS
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import first_line


class TemplateRefusal(LabError):
    """The chat template refuses a conversation (it raises: roles that do not alternate, a tool call it
    cannot write), or writes it so that an assistant turn cannot be placed in its render (DeepSeek-V3's
    writes a second turn of tool calls without its assistant header): a fault of that conversation under
    this template, which `data prepare` skips and counts (an error under --strict), not of the run."""


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False,
           template_kwargs: dict | None = None, tools: list[dict] | None = None) -> str:
    """The chat template's text; `template_kwargs` are its extra variables, as SGLang and vLLM take
    them per request (`chat_template_kwargs`, e.g. `{"enable_thinking": false}`); `tools` the
    conversation's (the request's `tools`), which templates list in the system turn.

    A tool call's arguments go as an object, as transformers documents and vLLM and SGLang hand them
    (Qwen's and Llama 3.1's templates write them with `tojson`); to a template that concatenates them
    as text (DeepSeek-V3's, R1's: a TypeError for str + dict) as their JSON text, the form the model
    wrote. That choice is kept per tokenizer and template, so every later render (the prefixes the
    loss mask is found with, a regenerated turn's prompt) writes the calls alike."""
    # Older transformers pass each message as it is; 5.x also fills `thinking` from `reasoning_content`.
    # Sampling records go: transformers walks every value of every message on each render, which with
    # the answers' token ids took an 80-turn conversation 17.8 s to encode where 1.1 s do.
    parts = reads_thinking_parts(tokenizer)
    messages = [_for_template({k: v for k, v in m.items() if k not in SAMPLING_FIELDS}, parts) for m in messages]
    template = tokenizer.chat_template
    as_text = _TEXT_ARGUMENTS.get(tokenizer) == template
    kwargs = {k: v for k, v in (template_kwargs or {}).items() if k != TEMPLATE_DATE}  # the lab's, not the template's
    day = (template_kwargs or {}).get(TEMPLATE_DATE)
    clock = _clock_at(tokenizer, day) if day is not None and reads_clock(tokenizer) else contextlib.nullcontext()

    def apply(msgs: list[dict]) -> str:
        return tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **kwargs)

    with clock:
        try:
            try:
                return apply(_arguments_as_text(messages) if as_text else messages)
            except TypeError as e:
                texted = _arguments_as_text(messages)
                if as_text or texted == messages or not _CONCATENATED_DICT.search(str(e)):
                    raise
            text = apply(texted)
            _TEXT_ARGUMENTS[tokenizer] = template
            return text
        except Exception as e:  # jinja raises its own errors (e.g. "roles must alternate")
            raise TemplateRefusal(f"chat template rejects the conversation: {first_line(e)}") from None


def reads_clock(tokenizer) -> bool:
    """Whether the chat template (any of a dict of named ones) calls `strftime_now`, which transformers
    answers from the clock: its text then depends on the day it is rendered."""
    return "strftime_now" in json.dumps(tokenizer.chat_template)


def pinned(tokenizer, template_kwargs: dict | None, recorded: Iterable[dict | None] = ()) -> dict | None:
    """`template_kwargs` with the day a chat template that reads the clock renders (TEMPLATE_DATE), for
    a run to record and render with throughout: the one they name, else that of the first of
    `recorded` (settings that record how text was rendered: the manifest a run resumes, the
    `rendered_with` of answers it takes) made with this template, else today. Unchanged for a template
    that reads no clock (so the settings of such runs stay as they were), and where that first record
    names no day: work begun before the lab pinned it resumes as it was made. A record whose variables
    are no object, or whose day is no day, pins nothing: the check of the work it records (its manifest,
    journal or answers against these settings) then refuses it naming its file, which this cannot."""
    if not reads_clock(tokenizer) or TEMPLATE_DATE in (template_kwargs or {}):
        return template_kwargs
    ours = template_sha256(tokenizer)
    before = next((kw for r in recorded if (kw := _recorded_kwargs(r, ours)) is not None), None)
    if before is not None and TEMPLATE_DATE not in before:
        return template_kwargs
    return {**(template_kwargs or {}), TEMPLATE_DATE: before[TEMPLATE_DATE] if before else _today()}


def _recorded_kwargs(record, template: str) -> dict | None:
    """The template variables `record` (one of `pinned`'s) names ({} for none), where it was made with
    `template` (its hash) and they are an object whose day, if any, is a day; None otherwise."""
    if not isinstance(record, dict) or record.get(TEMPLATE_HASH) != template:
        return None
    kwargs = record.get("chat_template_kwargs")
    return None if recorded_kwargs_problem(kwargs) else kwargs or {}


def _today() -> str:
    """The day the template would render now: that of the clock transformers gives it (under the lock,
    which no pin of another thread then holds)."""
    from transformers.utils import chat_template_utils

    with _CLOCK:
        return chat_template_utils.datetime.now().date().isoformat()


_CLOCK = threading.Lock()
_PIN_PROBE = "{{ strftime_now('%Y-%m-%d') }}"
_pin_checked = False


@contextlib.contextmanager
def _clock_at(tokenizer, day):
    """transformers' clock (its `strftime_now` reads `datetime.now()` of its chat template module) set to
    midnight of `day` while the block runs; pinned renders of other threads wait. Checked, once, on a probe
    template: a transformers that reads the clock otherwise would render today unseen."""
    global _pin_checked
    from transformers.utils import chat_template_utils

    try:
        at = template_date(day)
    except ValueError as e:
        raise LabError(str(e)) from None

    class Pinned(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(at.year, at.month, at.day, tzinfo=tz)

    with _CLOCK:
        real = chat_template_utils.datetime
        chat_template_utils.datetime = Pinned
        try:
            if not _pin_checked:
                if tokenizer.apply_chat_template([{"role": "user", "content": ""}], chat_template=_PIN_PROBE,
                                                 tokenize=False) != at.isoformat():
                    raise LabError(f"this transformers reads the chat template's clock otherwise: cannot render "
                                   f"{TEMPLATE_DATE} {day}")
                _pin_checked = True
            yield
        finally:
            chat_template_utils.datetime = real


# A template that concatenates a tool call's arguments as text (DeepSeek-V3's, R1's, V3.1's; jinja's
# `indent` filter, which appends to its input): Python's TypeError for str + dict, either way round.
_CONCATENATED_DICT = re.compile(r"""concatenate str \(not "dict"\)|for \+=?: 'dict' and 'str'""")
_TEXT_ARGUMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _arguments_as_text(messages: list[dict]) -> list[dict]:
    """The messages with each tool call's arguments as JSON text (conversations.py reads them as an
    object), as the OpenAI API carries them and `tojson` writes them."""
    def text(call: dict) -> dict:
        args = call["function"]["arguments"]
        return call if isinstance(args, str) else {**call, "function": {**call["function"], "arguments":
                                                                          json.dumps(args, ensure_ascii=False)}}
    return [{**m, "tool_calls": [text(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def _for_template(m: dict, parts: bool) -> dict:
    """A message as the template reads its thinking: also as `thinking` (harmony's name), or, where the
    template writes thinking from content parts, as a thinking part ahead of the answer's text."""
    if "reasoning_content" not in m:
        return m
    if not parts:
        return {"thinking": m["reasoning_content"], **m}
    rest = {k: v for k, v in m.items() if k != "reasoning_content"}
    text = [{"type": "text", "text": m["content"]}] if m["content"] else []
    return {**rest, "content": [{"type": "thinking", "thinking": m["reasoning_content"]}, *text]}


_PROBE_THOUGHT, _PROBE_ANSWER = "drafter_lab probe: a thought", "drafter_lab probe: an answer"
_READS_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reads_thinking_parts(tokenizer) -> bool:
    """Whether the chat template writes an answer's thinking from a `{"type": "thinking"}` content part
    (Mistral's reasoning templates, Magistral's and Ministral-3 Reasoning's, which read no
    `reasoning_content` and write `[THINK]...[/THINK]` before the text): one probe render per
    template, kept per tokenizer. A template that writes the parts' repr (a list taken for text) does
    not read them."""
    template = tokenizer.chat_template
    cached = _READS_PARTS.get(tokenizer)
    if cached is None or cached[0] != template:
        probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": _PROBE_THOUGHT}, {"type": "text", "text": _PROBE_ANSWER}]}]
        try:
            out = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception:  # a template that takes text only may raise on parts, in any manner
            out = ""
        reads = (_PROBE_ANSWER in out and _PROBE_THOUGHT in out[:out.find(_PROBE_ANSWER)]
                 and "'thinking'" not in out and '"thinking"' not in out)
        cached = _READS_PARTS[tokenizer] = (template, reads)
    return cached[1]


def template_sha256(tokenizer) -> str:
    """A hash of the chat template `render` applies (the tokenizer's; a dict of named ones whole):
    text rendered with another template is other data, though the target's weights are the same."""
    return sha256_json(tokenizer.chat_template)[:16]


TOKENIZER_PROBE = (
    " Hello, world!\n\tIt's 2026: 3.14159 × 10^5 ≈ 314159.  Café naïve façade; ÆØÅ ß ﬁ Ω.\r\n"
    "你好，世界。こんにちは、世界。안녕하세요 मराठी العربية русский 🙂👍🏽🚀\n"
    "def f(x):\n    return x ** 2  # tabs\tand  double  spaces\n\n\n<think>\n\n</think>\n\n"
)
"""Text that exercises what tokenizers differ in: whitespace runs, digits, accents, scripts, emoji, code."""


def tokenizer_sha256(tokenizer) -> str:
    """A hash of how the tokenizer turns rendered text into ids, as the lab encodes it: its vocabulary
    (added tokens included), its special tokens, and its ids for a probe text with them all in it.
    A re-saved tokenizer hashes alike; a changed vocabulary, special token or normalisation (say a
    model update's fixed tokenizer.json, in a directory whose weights are the same) does not. Merges
    that change no id of the probe go unseen."""
    specials = tokenizer.special_tokens_map
    probe = TOKENIZER_PROBE + "".join(sorted(set(tokenizer.all_special_tokens)))
    ids = tokenizer(probe, add_special_tokens=False)["input_ids"]
    # = sha256_json([sorted vocabulary, specials, ids]), with the vocabulary's part hashed once.
    h = _vocab_hashed(tokenizer).copy()
    h.update(f"{_json(specials)}, {_json(ids)}]".encode())
    return h.hexdigest()[:16]


_VOCAB_HASHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab_hashed(tokenizer):
    """sha256 fed with the start of sha256_json's text of [sorted vocabulary, ...], kept per
    tokenizer object while its size holds: a command asks for the hash two or three times, and
    sorting and writing out a 150k vocabulary takes most of a second each time."""
    cached = _VOCAB_HASHED.get(tokenizer)
    if cached is None or cached[0] != len(tokenizer):
        cached = (len(tokenizer), hashlib.sha256(f"[{_json(sorted(tokenizer.get_vocab().items()))}, ".encode()))
        _VOCAB_HASHED[tokenizer] = cached
    return cached[1]


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def rendered_with(tokenizer, template_kwargs: dict | None) -> dict:
    """How `render` writes prompts and the tokenizer reads them: the template's hash, its variables
    when there are any, and the tokenizer's hash (kept on each regenerated answer, which was sampled
    after such a prompt)."""
    return {TEMPLATE_HASH: template_sha256(tokenizer), **template_setting(template_kwargs),
            TOKENIZER_HASH: tokenizer_sha256(tokenizer)}


def special_token_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


class Span(NamedTuple):
    """Where an assistant turn lies in a conversation's render, as character offsets."""

    start: int
    """Where the turn's text begins (after the generation prompt)."""
    stop: int
    """The end of its region: its own render's end (with the stop token after it, where the template
    closes the turn only once another message follows), else where the next message's text begins."""
    own: bool
    """`stop` is the end of the turn's own render (the template writes it alike once later turns follow)."""
    after: int
    """Where its end-of-turn token is looked for from (past its answer, where that is found)."""
    bounded: bool
    """The region holds no later turn's text, so a token the target stops at in it is the turn's own."""


def assistant_char_spans(tokenizer, messages: list[dict], text: str, template_kwargs: dict | None = None,
                         tools: list[dict] | None = None, end_ids: frozenset[int] = frozenset(),
                         last_only: bool = False) -> list[Span]:
    """Per assistant turn, its `Span` in `text`; a turn's own render is followed there by a token in
    `end_ids` where the template closes a turn only once another message follows (`_closing`).
    `last_only`: the last turn's alone (a list of one); where it begins as the render before it ends,
    as it does but for GPT-OSS's tool calls, that costs two renders, not two per turn (`turns="each"`
    encodes a sequence per turn: n sequences of up to n turns, which was cubic in n)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if last_only and turns and turns[-1]:
        i = turns[-1]
        head = render(tokenizer, messages[:i], True, template_kwargs, tools)
        if text.startswith(head):  # no earlier turn's text to look past
            return [_span(tokenizer, messages, i, text, len(head), template_kwargs, tools, end_ids, head)[0]]
    plain, common = _unserved(tokenizer, messages, text, template_kwargs, tools)
    spans = []
    cursor = 0
    for i in turns:
        span = None
        if i + 1 < len(messages) and plain != text:  # an earlier turn, placed before the last turn was served
            span, after = _span(tokenizer, messages, i, plain, cursor, template_kwargs, tools, end_ids)
            span = span if max(span.stop, after) <= common else None
        if span is None:
            span, after = _span(tokenizer, messages, i, text, cursor, template_kwargs, tools, end_ids)
        spans.append(span)
        cursor = after
    return spans[-1:] if last_only else spans


def _unserved(tokenizer, messages: list[dict], text: str, template_kwargs: dict | None,
              tools: list[dict] | None) -> tuple[str, int]:
    """(The conversation's render, how much of `text` it starts with), where the earlier turns are
    placed: in `text`, its last turn perhaps written as served (`_as_served`), `_located` finds no
    message (it compares all that follows one), and a turn looked for by its answer alone is found in
    a user message before it that holds that answer ("Say hi")."""
    if messages[-1]["role"] != "assistant" or not _thinking_of(messages[-1]):
        return text, len(text)  # not rewritten (spares a render)
    plain = _whole(tokenizer, messages, text, template_kwargs, tools)
    return plain, len(os.path.commonprefix([plain, text]))


def _whole(tokenizer, messages: list[dict], text: str, template_kwargs: dict | None, tools: list[dict] | None) -> str:
    """The template's render of all `messages`: the one `served_text` made `text` from, where it did (not
    rendered again), else rendered."""
    return text.plain if isinstance(text, _Served) else render(tokenizer, messages, False, template_kwargs, tools)


def _span(tokenizer, messages: list[dict], i: int, text: str, cursor: int, template_kwargs: dict | None,
          tools: list[dict] | None, end_ids: frozenset[int], head: str | None = None) -> tuple[Span, int]:
    """(Assistant turn i's `Span` in `text`, where the next turn is looked for from), the turn lying
    past `cursor`; `head`, the render before it with the generation prompt, where the caller has it."""
    m = messages[i]
    if head is None and i:
        head = render(tokenizer, messages[:i], True, template_kwargs, tools)
    start = None
    if head is not None:
        start = len(head) if text.startswith(head) else _turn_start(tokenizer, messages, i, text, template_kwargs, tools)
    if start is not None and start >= cursor:
        after = start
    else:
        # After a prompt the template writes otherwise here (DeepSeek-R1's `<think>\n`, Qwen3's empty
        # think block): where the template writes the turn's text, found by its marker, not by the text,
        # which an earlier message may hold ("Now say bye" before "bye"); its text is looked for only
        # where it is not written once as given (inline thinking the template cuts), and only between
        # the messages around it (`_between`).
        placed = _located(tokenizer, messages, i, text, template_kwargs, tools)
        if placed is not None and placed[0] >= cursor:
            start, after = placed[0], placed[0] + placed[1]
        else:
            start, answer = _shown(m, text, *_between(tokenizer, messages, i, text, cursor, template_kwargs, tools))
            if start < 0:
                raise TemplateRefusal(f"chat template drops or rewrites assistant turn {i}; cannot place its loss mask")
            after = start + len(answer)
    upto = (_whole(tokenizer, messages, text, template_kwargs, tools) if i + 1 == len(messages)
            else render(tokenizer, messages[: i + 1], False, template_kwargs, tools))
    # The end-of-turn token is looked for past the answer: one written in it (a dataset's literal
    # `<|im_end|>`, which the tokenizer reads as that token) is the answer's text, not its end.
    if text.startswith(upto) and len(upto) > start:
        # The stop token right after that render is the turn's where the render leaves the turn open;
        # after one that closes it, it is the next turn's (an empty answer's `</s>`, where Mistral's
        # writes consecutive answers with nothing between them: taken, it left that turn unplaced).
        closed = _stop_token_at(tokenizer, upto.rstrip(), -1, end_ids)
        after = len(upto) + (0 if closed else len(_stop_token_at(tokenizer, text, len(upto), end_ids)))
        return Span(start, after, True, _answer_end(text, m, start, len(upto)), True), after
    if i + 1 == len(messages):  # the last turn written as served (`_as_served`): the rest is the target's
        return Span(start, len(text), True, _answer_end(text, m, start, len(text)), True), after
    # Written otherwise once later turns follow: the end-of-turn token alone closes the span, bounded by
    # the next message written past the turn. One the template moves ahead of it (DeepSeek-V3's system
    # turns, all joined at the top) bounds nothing: taken as the bound, it left the turn an empty mask.
    later = (_located(tokenizer, messages, j, text, template_kwargs, tools) for j in range(i + 1, len(messages)))
    nxt = next((p for p in later if p is None or p[0] >= start), None)
    bound = len(text) if nxt is None else nxt[0]
    return Span(start, bound, False, _answer_end(text, m, start, bound), nxt is not None), after


MARK = "\ue000\ue001"
"""Stands for a message's text in a render that locates it (private-use characters, which no
template writes)."""


def _located(tokenizer, messages: list[dict], j: int, text: str, template_kwargs: dict | None,
             tools: list[dict] | None) -> tuple[int, int] | None:
    """(Where message j's text begins in `text`, the conversation's render, its length there): from the
    render with that text replaced by MARK, if that render is `text` with this one replacement (the
    length is the difference, so text the template escapes, as GPT-OSS's `tojson` does tool results,
    is placed too), `text` perhaps going on with the stop token that closes an open last turn
    (`_closing`); None for a template that writes it twice, or otherwise. Looking for the text itself
    would stop at a short message ("Thanks") that an answer before it contains."""
    marked = render(tokenizer, [*messages[:j], {**messages[j], "content": MARK}, *messages[j + 1:]], False,
                    template_kwargs, tools)
    at, n = marked.find(MARK), len(text) - len(marked) + len(MARK)
    if at < 0 or marked[:at] != text[:at]:
        return None
    tail = marked[at + len(MARK):]
    if text[at + n:] == tail:
        return at, n
    # A last turn the template leaves open ends `text` with the stop token `_closing` adds, which this
    # render lacks: taken for part of message j, no message before that turn was placed (nor bounded one).
    closers = [t for t in _added_tokens(tokenizer)
               if text.endswith(t) and n >= len(t) and text.startswith(tail, at + n - len(t))]
    return (at, n - len(max(closers, key=len))) if closers else None  # the longest: one ending another is not it


def _added_tokens(tokenizer) -> set[str]:
    """The text of each token the tokenizer never splits (its added and special tokens)."""
    added = {tok.content for tok in getattr(tokenizer, "added_tokens_decoder", {}).values()}
    return {t for t in added | set(tokenizer.all_special_tokens) if t}


def _turn_start(tokenizer, messages: list[dict], i: int, text: str, template_kwargs: dict | None,
                tools: list[dict] | None) -> int | None:
    """Where assistant turn i begins in `text` when the render of the turns before it (with the
    generation prompt) does not start it (GPT-OSS writes a tool call's analysis until a final answer
    follows): past message i-1's text and what that render writes after it (the message's closing and
    the generation prompt); None where that is not there."""
    prev = _located(tokenizer, messages, i - 1, text, template_kwargs, tools)
    if prev is None:
        return None
    head = render(tokenizer, [*messages[:i - 1], {**messages[i - 1], "content": MARK}], True, template_kwargs, tools)
    at, end = head.find(MARK), prev[0] + prev[1]
    tail = head[at + len(MARK):]
    return end + len(tail) if at >= 0 and text.startswith(tail, end) else None


def _between(tokenizer, messages: list[dict], i: int, text: str, cursor: int, template_kwargs: dict | None,
             tools: list[dict] | None) -> tuple[int, int]:
    """The part of `text` from `cursor` where turn i's text may be: past the message before it and up to
    the one after it, where the template writes them there. Looked for from `cursor` alone, a template
    that drops the turn had it found in a user message that holds its text ("Say hi." before "hi"), and
    that message masked as the answer, where the conversation is to be refused."""
    before = _located(tokenizer, messages, i - 1, text, template_kwargs, tools) if i else None
    lo = max(cursor, before[0] + before[1]) if before else cursor
    later = _located(tokenizer, messages, i + 1, text, template_kwargs, tools) if i + 1 < len(messages) else None
    return lo, later[0] if later and later[0] >= lo else len(text)


def _stop_token_at(tokenizer, text: str, at: int, end_ids: frozenset[int]) -> str:
    """The token in `end_ids` that `text` holds at offset `at` (-1: the one it ends with), as text; ''
    where none is there (end tokens are special: the tokenizer never splits them, so their text there
    is that token)."""
    names = tokenizer.convert_ids_to_tokens(sorted(end_ids))  # None for an id past the tokenizer (a padded vocab)
    if at < 0:
        return next((n for n in names if n is not None and text.endswith(n)), "")
    return next((n for n in names if n is not None and text.startswith(n, at)), "")


def _closing(tokenizer, messages: list[dict], text: str, end_ids: frozenset[int], template_kwargs: dict | None,
             tools: list[dict] | None) -> str:
    """The token the target stops at that closes the conversation's last assistant turn, where the
    template writes it only once the conversation goes on (Kimi-K2-Instruct-0905's leaves the last
    message open, for prefill): the target ends that answer with it all the same, so the drafter is
    to learn it; '' where the render (`text`) closes the turn itself, or ends otherwise."""
    if not end_ids or messages[-1]["role"] != "assistant":
        return ""
    more = render(tokenizer, messages, True, template_kwargs, tools)
    return _stop_token_at(tokenizer, more, len(text), end_ids) if more.startswith(text) else ""


THINK, UNTHINK = "<think>", "</think>"
"""The tags around a thinking model's thinking (DeepSeek-R1 and V3.1, QwQ, Qwen3, Kimi-K2, GLM-Z1)."""
THINK_TAGS = ((THINK, UNTHINK), ("[THINK]", "[/THINK]"))
"""Those, and Mistral's (Magistral, Ministral-3 Reasoning: control tokens of their tokenizers)."""
OPENS_THINKING = re.compile(r"<think>(\s*)\Z")
"""A generation prompt that opens the target's thinking (`<think>\n`: DeepSeek-R1, QwQ; `<think>`:
DeepSeek-V3.1's and Kimi-K2.5's with thinking on), and the whitespace after the tag."""
EMPTY_THINKING = re.compile(r"\s*(<think>(\s*)</think>)\s*")
"""An empty think block (with the whitespace inside it) that the template writes before an answer whose
thinking it hides, where the target opened the block itself (Kimi-K2-Thinking's)."""
HIDDEN_THINKING = re.compile(r"\s*(?:<think>\s*)?</think>")
"""What a template writes where a turn's thinking was, for the turns whose thinking it hides: an empty
block (Kimi-K2-Thinking's), or the close of one its generation prompt opened (Kimi-K2.5's)."""


def _as_served(tokenizer, messages: list[dict], text: str, template_kwargs: dict | None,
               tools: list[dict] | None) -> str:
    """`text` (the conversation's render) with its last turn written as the target was served it, where
    the template hides that turn's thinking: the generation prompt, then the thinking, `</think>` and
    the answer as the template writes it (with what follows). DeepSeek-R1's and QwQ's templates never
    read `reasoning_content`, cut inline thinking up to `</think>` and render no `<think>`; Kimi-K2.5's
    and Kimi-K2-Thinking's write an empty block for every turn up to the last answer: without this
    their drafters never trained on the thinking, most of what they serve. Where the prompt opens the
    block, the thinking joins as these models write it: `R\n</think>\n\n` after `<think>\n`,
    `R</think>` after `<think>`; else it goes inside the empty block the template writes for the turn.
    The prompt is the one the target saw, with the thinking of the tool calls just before (Kimi's
    interleaved thinking, which the template hides once the answer follows). `text` as it was where
    the turn shows its thinking, or is no thinking turn."""
    last = messages[-1]
    thinking = _thinking_of(last) if last["role"] == "assistant" else ""
    split = "reasoning_content" in last
    if len(messages) < 2 or not thinking or (split and thinking in text) or not (split or UNTHINK in last["content"]):
        return text  # no thinking, shown (spares the renders below), or not in `<think>` tags
    i = len(messages) - 1
    head = render(tokenizer, messages[:-1], True, template_kwargs, tools)
    opener = OPENS_THINKING.search(head)
    if not opener and text.startswith(head) and not EMPTY_THINKING.match(text, len(head)):
        return text  # neither the prompt nor the template opens a block there (spares a render)
    placed = _located(tokenizer, messages, i, text, template_kwargs, tools)
    if placed is None:
        return text
    at, n = placed
    if split:
        own, rest = thinking, at
    else:  # inline, as a local regeneration keeps it: cut, or written as given
        content = last["content"]
        own = content[:content.index(UNTHINK) + len(UNTHINK)]
        written = text[at:at + n]
        rest = at + written.index(UNTHINK) + len(UNTHINK) if UNTHINK in written else at
        if own.lstrip().startswith(THINK):
            own = own.lstrip()
    if opener:
        (gap,) = opener.groups()
        if split:
            own += "\n" + UNTHINK + "\n\n" if gap else UNTHINK
        elif own.startswith(THINK):  # the generation prompt writes it
            own = own.removeprefix(THINK).removeprefix(gap)
        return head + own + text[rest:]
    start = len(head) if text.startswith(head) else _turn_start(tokenizer, messages, i, text, template_kwargs, tools)
    block = None if start is None else EMPTY_THINKING.fullmatch(text, start, at)
    if block is None:
        return text
    if split:
        mid = (block.start(2) + block.end(2)) // 2
        return head + text[start:mid] + own + text[mid:]
    return head + text[start:block.start(1)] + ("" if own.startswith(THINK) else THINK) + own + text[rest:]


def _shown(turn: dict, text: str, lo: int, hi: int) -> tuple[int, str]:
    """(Where `turn`'s answer begins in text[lo:hi], the answer found there): its content, else what
    follows its last `</think>` (inline thinking, which DeepSeek-R1's and Qwen3's templates cut from
    earlier turns); (-1, "") where neither is, or the turn has no text (a bare tool call)."""
    for answer in dict.fromkeys((turn["content"].strip(), turn["content"].rpartition(UNTHINK)[2].strip())):
        at = text.find(answer, lo, hi) if answer else -1
        if at >= 0:
            return at, answer
    return -1, ""


def _answer_end(text: str, turn: dict, start: int, bound: int) -> int:
    """Where `turn`'s answer ends in `text`, looked for from `start` up to `bound`, where the next
    message's text begins, and past the turn's thinking where that is written there (a thinking that
    holds the answer's text, "Reply ok", ahead of a literal end token ended the mask there); where
    the answer is not found, past the thinking, else `start`."""
    thinking = _thinking_of(turn)
    shown = text.find(thinking, start, bound) if thinking else -1
    lo = start if shown < 0 else shown + len(thinking)
    at, answer = _shown(turn, text, lo, bound)
    return lo if at < 0 else at + len(answer)


def _tokenize(tokenizer, text: str, at: int = 0) -> tuple[list[int], list[int]]:
    """Token ids of `text` and the character offset (plus `at`) where each starts."""
    try:
        enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    except (NotImplementedError, ValueError) as e:
        # transformers 4's Python tokenizers raise the first; mistral-common's backend the second
        if isinstance(e, ValueError) and "offsets_mapping" not in str(e):
            raise
        raise LabError("tokenizer gives no character offsets (a fast tokenizer is needed)") from None
    return list(enc["input_ids"]), [at + a for a, _ in enc["offset_mapping"]]


def _thinking_of(turn: dict) -> str:
    """An assistant turn's thinking: `reasoning_content`, else its content's before `</think>` (or
    Mistral's `[/THINK]`)."""
    if "reasoning_content" in turn:
        return turn["reasoning_content"].strip()
    for opening, closing in THINK_TAGS:
        inline, closed, _ = turn["content"].partition(closing)
        if closed:
            return inline.strip().removeprefix(opening).strip()
    return ""


def dropped_reasoning(tokenizer, messages: list[dict], template_kwargs: dict | None = None,
                      tools: list[dict] | None = None, last_only: bool = False,
                      text: str | None = None) -> tuple[int, int]:
    """(assistant turns with reasoning, those whose reasoning the chat template leaves out of the render):
    kept apart, or inline before `</think>` (a local regeneration's text, which Qwen3's and DeepSeek-R1's
    templates cut); of the last assistant turn alone where `last_only`. `text`: the conversation as
    `served_text` writes it, where the caller has it."""
    turns = [m for m in messages if m["role"] == "assistant"]
    thought = [t for m in (turns[-1:] if last_only else turns) if (t := _thinking_of(m))]
    if not thought:
        return 0, 0
    if text is None:
        text = served_text(tokenizer, messages, frozenset(), template_kwargs, tools)
    return len(thought), sum(r not in text for r in thought)


def dropped_calls(tokenizer, messages: list[dict], template_kwargs: dict | None = None,
                  tools: list[dict] | None = None, last_only: bool = False) -> tuple[int, int]:
    """(assistant turns making tool calls, those with a call the chat template does not write): a
    template without tool support writes none (the lab's default ChatML: the conversation renders
    alike without them); GPT-OSS's writes a turn's first call alone (it renders alike without the
    turn's last one); others the calls of some turns alone (a turn's only call, left out, renders alike
    without it). One render more, and one per turn making calls. Of the last assistant turn alone where
    `last_only`."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    calling = [i for i in (turns[-1:] if last_only else turns) if "tool_calls" in messages[i]]
    if not calling:
        return 0, 0
    text = render(tokenizer, messages, False, template_kwargs, tools)

    def alike(variant: list[dict]) -> bool:
        # A variant the template refuses is not written alike: Mistral's tool templates check that user
        # and assistant turns alternate, turns with calls aside, and the turns bare of calls do not.
        try:
            return render(tokenizer, variant, False, template_kwargs, tools) == text
        except LabError:
            return False

    def bare(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "tool_calls"}

    if alike([bare(m) for m in messages]):
        return len(calling), len(calling)
    # Each turn less its last call: a turn's only call goes with its key, as the conversation's did above.
    less = [[*messages[:i], {**messages[i], "tool_calls": calls} if (calls := messages[i]["tool_calls"][:-1])
             else bare(messages[i]), *messages[i + 1:]] for i in calling]
    return len(calling), sum(alike(m) for m in less)


def _closer(ids: list[int], span: Span, end_ids: frozenset[int], special: set[int]) -> int | None:
    """Index in `ids` (the turn's region as the template wrote it, from `span.after`) of its
    end-of-turn token: the first token the target stops at, in a region holding no later turn
    (GPT-OSS's `<|call|>`, which its render of the turn alone writes too); else, in the turn's own
    render, its last special token (Gemma's, harmony's closer), and in a region written otherwise, the
    first special token past the answer (harmony's `<|end|>`, where the turn alone has `<|return|>`)."""
    ends = [k for k, t in enumerate(ids) if t in end_ids] if span.bounded else []
    marks = [k for k, t in enumerate(ids) if t in special]
    if ends:
        return ends[0]
    return (marks[-1] if span.own else marks[0]) if marks else None


def _turn_end(tokenizer, text: str, span: Span, end_ids: frozenset[int], special: set[int]) -> int | None:
    """Where the turn's end-of-turn token (`_closer`) begins in `text`, None without one."""
    ids, starts = _tokenize(tokenizer, text[span.start:span.stop], span.start)
    looked = [k for k, at in enumerate(starts) if at >= span.after]
    k = _closer([ids[j] for j in looked], span, end_ids, special)
    return None if k is None else starts[looked[k]]


def _answer_written(tokenizer, text: str, span: Span, content: str, end_ids: frozenset[int],
                    special: set[int]) -> int | None:
    """Where the text a turn's sampled ids stand for ends in `text`: its answer as the template wrote
    it (trimmed, perhaps), at the turn's start or after a header of the template's own before the
    turn's end-of-turn token (harmony's `<|channel|>final<|message|>`, which the target samples too);
    None where the answer is not there (the template rewrites it)."""
    start = span.start
    for c in (content, content.strip()):
        if text.startswith(c, start):
            return start + len(c)
    close = _turn_end(tokenizer, text, span, end_ids, special)
    at = text.find(content.strip(), start, close) if content.strip() and close is not None else -1
    return None if at < 0 else at + len(content.strip())


def _placed_turns(messages: list[dict], spans: list[Span]) -> list[tuple[int, dict, Span]]:
    """(index, message, span) of the assistant turns `spans` places: every one, or the last alone."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [(i, messages[i], span) for i, span in zip(turns[len(turns) - len(spans):], spans)]


def _spliced(tokenizer, messages: list[dict], text: str, spans: list[Span],
             end_ids: frozenset[int], special: set[int]) -> tuple[list[int], list[int], list[bool]]:
    """Ids and starts of `text` with the text of each assistant turn that `spans` places (every one,
    or the last) replaced by its `token_ids` (all starting at the turn's offset, so the span masks
    them), and which ids the target sampled. A trailing id in `end_ids` is the end token the sampling
    stopped at (a server returns it): the template writes its own. A turn of tool calls without ids
    (regeneration keeps those as recorded: the tool results answer them) stays text."""
    ids: list[int] = []
    starts: list[int] = []
    sampled: list[bool] = []
    cursor = 0
    for i, m, span in _placed_turns(messages, spans):
        start = span.start
        if "token_ids" not in m and "tool_calls" in m:
            continue
        if "token_ids" not in m:
            raise LabError(f"assistant turn {i} has no token_ids: a token-exact capture needs the target's own "
                           "tokens (data prepare --regenerate, or data regenerate)")
        # All the template wrote (or left out) for the turn: thinking kept apart or inline (an earlier
        # turn's, which R1's and Qwen3's templates cut, is not where its whole content is looked for).
        if "reasoning_content" in m or "tool_calls" in m or _thinking_of(m):
            end = _turn_end(tokenizer, text, span, end_ids, special)
        else:
            end = _answer_written(tokenizer, text, span, m["content"], end_ids, special)
        if end is None:
            raise TemplateRefusal(f"chat template rewrites assistant turn {i}: cannot place the target's own tokens")
        answer = m["token_ids"][:-1] if m["token_ids"] and m["token_ids"][-1] in end_ids else m["token_ids"]
        if any(t >= len(tokenizer) for t in answer):
            raise LabError(f"assistant turn {i} holds token ids past the tokenizer's {len(tokenizer)}")
        piece, at = _tokenize(tokenizer, text[cursor:start], cursor)
        ids += piece + answer
        starts += at + [start] * len(answer)
        sampled += [False] * len(piece) + [True] * len(answer)
        cursor = end
    piece, at = _tokenize(tokenizer, text[cursor:], cursor)
    return ids + piece, starts + at, sampled + [False] * len(piece)


class _Served(str):
    """`served_text`'s text, carrying the template's render it was made from (`plain`), which placing
    the turns takes (`_whole`): passed along with the text, not rendered again."""

    plain: str


def served_text(tokenizer, messages: list[dict], end_ids: frozenset[int], template_kwargs: dict | None,
                tools: list[dict] | None) -> str:
    """The conversation's render as `encode_conversation` masks it: its last turn closed where the
    template leaves it open (`_closing`) and written as it was served (`_as_served`)."""
    plain = render(tokenizer, messages, False, template_kwargs, tools)
    text = plain + _closing(tokenizer, messages, plain, end_ids, template_kwargs, tools)
    served = _Served(_as_served(tokenizer, messages, text, template_kwargs, tools))
    served.plain = plain
    return served


def _cut_close(text: str, turn: dict, starts: list[int], sampled: list[bool], first: int, close: int, span: Span,
               begin: int, token_exact: bool) -> int:
    """The last masked token of `turn`, cut at its token limit (finish_reason "length"), `close` being the
    last before its end-of-turn token: the target had not stopped, so neither that token nor what the
    template writes after the answer (Qwen3's `</think>` after a cut thinking) is its. Token-exact, its
    last sampled token; else the last token that begins within its answer (found, past the turn's start,
    up to `span.after`, with the whitespace it ends with where the template writes that too)."""
    if token_exact:
        return max((t for t in range(first, close + 1) if sampled[t]), default=close)
    if span.after <= begin:
        return close
    trailing = turn["content"][len(turn["content"].rstrip()):]
    end = span.after + len(trailing) if text.startswith(trailing, span.after) else span.after
    return min(close, bisect.bisect_left(starts, end) - 1)


def encode_conversation(tokenizer, messages: list[dict], max_length: int, token_exact: bool = False,
                        end_ids: frozenset[int] = frozenset(), template_kwargs: dict | None = None,
                        tools: list[dict] | None = None, last_only: bool = False,
                        text: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (LongTensor[T]) and loss mask (BoolTensor[T], True on assistant tokens), T <= max_length;
    `token_exact`: assistant turns as their `token_ids`, less a trailing end token (one of `end_ids`,
    the tokens the target stops at, which also end a turn's mask, but that of an answer cut at its token
    limit, `_cut_close`), and tool calls the target did not sample left unmasked; `template_kwargs` and
    `tools` as `render`; `last_only`: the last assistant turn alone is masked, and token-exact alone its
    `token_ids` (the others are prompt, as served); `text`: `served_text`, where the caller has it."""
    if text is None:
        text = served_text(tokenizer, messages, end_ids, template_kwargs, tools)
    # `last_only`, the earlier turns are prompt: their text rendered and tokenized, as a server reads a
    # conversation it is sent (and as the target saw it when it sampled the last turn), not their ids.
    spans = assistant_char_spans(tokenizer, messages, text, template_kwargs, tools, end_ids, last_only)
    special = special_token_ids(tokenizer)
    if token_exact:
        ids, starts, sampled = _spliced(tokenizer, messages, text, spans, end_ids, special)
    else:
        ids, starts = _tokenize(tokenizer, text)
        sampled = [False] * len(ids)
    mask = [False] * len(ids)
    for _, m, span in _placed_turns(messages, spans):
        if token_exact and "token_ids" not in m:  # recorded tool calls (_spliced): not the target's tokens
            continue
        begin = span.start
        if not token_exact and _thinking_of(m) and (hidden := HIDDEN_THINKING.match(text, begin)):
            begin = hidden.end()  # written in place of the turn's thinking: not what the target wrote
        elif not token_exact and UNTHINK in m["content"] and _thinking_of(m) not in text[begin:span.stop]:
            # Inline thinking cut up to `</think>` (R1's earlier turns): the whitespace after it that the
            # template writes ahead of the answer is not the answer's.
            after_tag = m["content"].rpartition(UNTHINK)[2]
            gap = after_tag[:len(after_tag) - len(after_tag.lstrip())]
            begin += len(gap) if text.startswith(gap, begin) else 0
        first, last = bisect.bisect_left(starts, begin), bisect.bisect_left(starts, span.stop)
        # Written by the template, not sampled by the target, from where the end-of-turn token may be.
        looked = [t for t in range(first, last) if not sampled[t] and starts[t] >= span.after]
        k = _closer([ids[t] for t in looked], span, end_ids, special)
        close = last - 1 if k is None else looked[k]
        if m.get("finish_reason") == CUT:
            close = _cut_close(text, m, starts, sampled, first, close if k is None else close - 1, span, begin,
                               token_exact)
        mask[first:close + 1] = [True] * (close + 1 - first)
    ids, mask = ids[:max_length], mask[:max_length]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)
