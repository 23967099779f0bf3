"""Each conversation's token ids and loss mask (chat.py), here or in worker processes.

Rendering dominates: each assistant turn renders the conversation up to it two or three times, so
a trace of n turns costs O(n^2) (a 200-step agent trace of 32k tokens: 8.7 s on one CPU core,
where its target forward takes far less on a GPU); so does `turns="each"`, n sequences that each
place their last turn alone. `CaptureConfig.tokenize_workers` > 1 spreads conversations over that
many processes, started with spawn (not fork: the parent holds the target, and perhaps
CUDA and thread pools); results come back in file order, as plain lists, whatever the count.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import torch

from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.chat import (
    TemplateRefusal,
    dropped_calls,
    dropped_reasoning,
    encode_conversation,
    served_text,
)
from drafter_lab.data.conversations import Conversation
from drafter_lab.errors import LabError
from drafter_lab.progress import maybe_progress


class Encoded(NamedTuple):
    """One conversation, encoded."""

    ids: torch.Tensor
    """Token ids, LongTensor[T]."""
    mask: torch.Tensor
    """Loss mask, BoolTensor[T]."""
    thought: tuple[int, int]
    """(Assistant turns with reasoning, those whose reasoning the template leaves out); (0, 0) token-exact,
    where the sampled ids hold the thinking whatever the template shows."""
    calls: tuple[int, int]
    """(Assistant turns making tool calls, those with a call the template leaves out)."""


def encoded(conv: Conversation, tokenizer, cfg: CaptureConfig, end_ids: frozenset[int]) -> Encoded:
    """`conv` encoded as `cfg` says; a LabError (a TemplateRefusal where it is one) names the conversation."""
    last_only = cfg.turns != "all"  # the sequence is cut after the turn it trains (capture.sequences_of)
    try:
        text = served_text(tokenizer, conv.messages, end_ids, cfg.chat_template_kwargs, conv.tools)
        ids, mask = encode_conversation(tokenizer, conv.messages, cfg.max_length, cfg.token_exact, end_ids,
                                        cfg.chat_template_kwargs, conv.tools, last_only, text)
    except LabError as e:
        raise (TemplateRefusal if isinstance(e, TemplateRefusal) else LabError)(f"conversation {conv.id}: {e}") from None
    thought = (0, 0) if cfg.token_exact else dropped_reasoning(tokenizer, conv.messages, cfg.chat_template_kwargs,
                                                               conv.tools, last_only, text)
    return Encoded(ids, mask, thought,
                   dropped_calls(tokenizer, conv.messages, cfg.chat_template_kwargs, conv.tools, last_only))


_WORKER: dict = {}
"""A worker process's tokenizer, settings and end ids (`_start`)."""


def _start(tokenizer, cfg: CaptureConfig, end_ids: frozenset[int]) -> None:
    torch.set_num_threads(1)  # the workers share the cores
    _WORKER.update(tokenizer=tokenizer, cfg=cfg, end_ids=end_ids)


def _encode(conv: Conversation):
    """`encoded` in a worker: lists, not tensors (which would cross as shared-memory handles, one
    file descriptor each), or the LabError (a TemplateRefusal where it is one)."""
    try:
        e = encoded(conv, _WORKER["tokenizer"], _WORKER["cfg"], _WORKER["end_ids"])
    except LabError as err:
        return err
    return e.ids.tolist(), e.mask.tolist(), e.thought, e.calls


def encodings(convs: list[Conversation], tokenizer, cfg: CaptureConfig, end_ids: frozenset[int], show: bool):
    """Yield `encoded` of each conversation in order, with progress where `show`, in `cfg.tokenize_workers`
    processes where more than one; a LabError names the conversation and stops the rest, but for a
    TemplateRefusal, yielded in its place to be skipped (raised under `cfg.strict`)."""
    def refused(e: LabError) -> LabError:
        if cfg.strict or not isinstance(e, TemplateRefusal):
            raise e
        return e

    with maybe_progress("tokenize conversations", len(convs), show) as advance:
        if cfg.tokenize_workers <= 1:
            for conv in convs:
                try:
                    e = encoded(conv, tokenizer, cfg, end_ids)
                except LabError as err:
                    e = refused(err)
                advance()  # before the yield: a caller that stops after the last one never resumes this
                yield e
            return
        pool = ProcessPoolExecutor(cfg.tokenize_workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start, initargs=(tokenizer, cfg, end_ids))
        try:
            for out in pool.map(_encode, convs, chunksize=max(1, len(convs) // (16 * cfg.tokenize_workers))):
                if isinstance(out, LabError):
                    advance()
                    yield refused(out)
                    continue
                ids, mask, thought, calls = out
                advance()
                yield Encoded(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool), thought, calls)
        finally:  # an error, or the caller stopping early: drop the conversations not begun
            pool.shutdown(cancel_futures=True)
