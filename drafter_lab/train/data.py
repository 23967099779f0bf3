"""Training examples from captured features, and deterministic padded batches.

Examples are read per batch (`Examples.take`), so a run holds the batch in hand, not the feature
set: a real target's features are terabytes. Each sequence is truncated to max_length, and the
target's top-1 over the FULL vocabulary, which accuracy is measured against, is computed from
`final_hidden` the first time the sequence is read and kept (4 bytes a token), with, for a
validation that measures sampled acceptance, the log-partition of the target's full-vocab logits at
its temperature (4 bytes more). The teacher distribution restricted to the draft vocab is recomputed
per batch (one matmul with the draft vocab's lm_head rows), cheaper than caching [tokens, N] floats.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from drafter_lab.data.shards import Sequence, SequenceRef, ShardReader
from drafter_lab.targets.hf import LogitMap


@dataclass
class Example:
    input_ids: torch.Tensor  # int64 [T]
    loss_mask: torch.Tensor  # bool [T]
    aux_hidden: torch.Tensor  # [T, 3*H_t]
    final_hidden: torch.Tensor  # [T, H_t]
    top1: torch.Tensor  # int64 [T]: target argmax over its full vocab at each position
    logz: torch.Tensor | None = None  # fp32 [T]: logsumexp of those logits / temperature (sampled validation)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] (False on padding)
    aux_hidden: torch.Tensor  # [B, T, 3*H_t]
    final_hidden: torch.Tensor  # [B, T, H_t]
    top1: torch.Tensor  # [B, T]
    logz: torch.Tensor | None = None  # [B, T], when the examples carry it

    def to(self, device) -> Batch:
        return Batch(*(t if t is None else t.to(device, non_blocking=True) for t in vars(self).values()))

    def pin(self) -> Batch:
        """In page-locked memory, so that `to(cuda)` copies asynchronously."""
        return Batch(*(t if t is None else t.pin_memory() for t in vars(self).values()))


@torch.no_grad()
def target_top1(final_hidden: torch.Tensor, lm_head: torch.Tensor, temperature: float = 0.0,
                chunk: int = 2048, logit_map: LogitMap = LogitMap()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's argmax over its full vocab at each position and, at temperature > 0, the
    log-partition logsumexp(logits / temperature) that normalises its sampling distribution; the
    logits are `logit_map(final_hidden @ lm_head.T)`, the target's own map (by default none)."""
    top1 = torch.empty(len(final_hidden), dtype=torch.long)
    logz = torch.empty(len(final_hidden)) if temperature > 0 else None
    w = lm_head.float()
    for a in range(0, len(final_hidden), chunk):
        logits = logit_map(final_hidden[a:a + chunk].to(w) @ w.T)
        top1[a:a + chunk] = logits.argmax(-1).cpu()
        if logz is not None:
            logz[a:a + chunk] = torch.logsumexp(logits / temperature, -1).cpu()
    return top1, logz


def _tokens(item) -> int:
    return len(item.input_ids) if isinstance(item, Sequence) else len(item)


class Examples:
    """Sequences (in memory, or located in shards and read on demand) as training examples.

    `read(items) -> Sequences` replaces the reading for items of another kind (an online run's
    prompts, whose states the target computes per batch). The full-vocab top-1 (and at
    `temperature` > 0 the log-partition there) is computed on `device` (the run's), where a real
    target's lm_head matmul belongs; the features themselves stay on the CPU until their batch is
    collated."""

    def __init__(self, items: list, lm_head_weight: torch.Tensor, max_length: int,
                 device: torch.device | str = "cpu", read=None, temperature: float = 0.0,
                 logit_map: LogitMap = LogitMap()):
        lengths = [min(_tokens(it), max_length) for it in items]
        self.items = [it for it, n in zip(items, lengths) if n >= 3]
        self.lengths = [n for n in lengths if n >= 3]
        """Tokens per example after truncation; sequences under 3 tokens are left out."""
        self.reader, self.max_length = ShardReader(), max_length
        self.read = read or self._read
        self.lm_head = lm_head_weight.detach().to(device=device, dtype=torch.float32)
        self.temperature, self.logit_map = temperature, logit_map
        self._target: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def __len__(self) -> int:
        return len(self.items)

    def _read(self, items: list[Sequence | SequenceRef]) -> list[Sequence]:
        return [it if isinstance(it, Sequence) else self.reader.read(it, self.max_length) for it in items]

    def take(self, ids: list[int]) -> list[Example]:
        out = []
        for i, s in zip(ids, self.read([self.items[i] for i in ids]), strict=True):
            n = self.lengths[i]
            final = s.final_hidden[:n]
            if i not in self._target:
                top1, logz = target_top1(final, self.lm_head, self.temperature, logit_map=self.logit_map)
                self._target[i] = top1.int(), logz
            top1, logz = self._target[i]
            out.append(Example(input_ids=s.input_ids[:n].long(), loss_mask=s.loss_mask[:n].bool(),
                               aux_hidden=s.aux_hidden[:n], final_hidden=final, top1=top1.long(), logz=logz))
        return out


def collate(examples: list[Example]) -> Batch:
    """Right-pad to the longest sequence (causal attention never sees the padding)."""
    B, T = len(examples), max(len(e) for e in examples)
    aux_w, fin_w = examples[0].aux_hidden.shape[1], examples[0].final_hidden.shape[1]
    dtype = torch.promote_types(examples[0].aux_hidden.dtype, torch.float32)  # bf16 features train in fp32
    batch = Batch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        loss_mask=torch.zeros(B, T, dtype=torch.bool),
        aux_hidden=torch.zeros(B, T, aux_w, dtype=dtype),
        final_hidden=torch.zeros(B, T, fin_w, dtype=dtype),
        top1=torch.zeros(B, T, dtype=torch.long),
        logz=None if examples[0].logz is None else torch.zeros(B, T),
    )
    for i, e in enumerate(examples):
        n = len(e)
        batch.input_ids[i, :n] = e.input_ids
        batch.loss_mask[i, :n] = e.loss_mask
        batch.aux_hidden[i, :n] = e.aux_hidden
        batch.final_hidden[i, :n] = e.final_hidden
        batch.top1[i, :n] = e.top1
        if batch.logz is not None:
            batch.logz[i, :n] = e.logz
    return batch


def plan_epoch(lengths: list[int], batch_size: int, batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The global batches of one epoch, a pure function of (lengths, sizes, seed, epoch).

    Shuffle, then sort by length inside windows of ~50 batches so that a batch pads little,
    then shuffle the batch order.
    """
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    window = 50 * max(batch_size, 1)
    sorted_order = []
    for a in range(0, len(order), window):
        sorted_order += sorted(order[a:a + window], key=lambda i: lengths[i])
    if batch_tokens > 0:
        batches = pack_padded(sorted_order, lengths, batch_tokens)
    else:
        batches = [sorted_order[a:a + batch_size] for a in range(0, len(sorted_order), batch_size)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


def pack_padded(rows: list[int], lengths: list[int], cap: int) -> list[list[int]]:
    """`rows` cut in order into as few parts as hold at most `cap` padded tokens each (rows x the
    part's longest; a row longer than `cap` stands alone)."""
    parts: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in rows:
        longest_if = max(longest, lengths[i])
        if cur and longest_if * (len(cur) + 1) > cap:
            parts.append(cur)
            cur, longest_if = [], lengths[i]
        cur.append(i)
        longest = longest_if
    if cur:
        parts.append(cur)
    return parts


def micro_batches(rows: list[int], lengths: list[int], n: int) -> list[list[int]]:
    """`rows` cut in order into at most n parts, the largest as small in padded tokens as any such
    cut allows (memory holds one part's activations at a time)."""
    longest = max(lengths[i] for i in rows)
    lo, hi = longest, len(rows) * longest  # hi: all rows in one part; under lo the longest row fits nowhere
    while lo < hi:  # the smallest cap that packs into n parts (fewer parts never need a larger cap)
        mid = (lo + hi) // 2
        if len(pack_padded(rows, lengths, mid)) <= n:
            hi = mid
        else:
            lo = mid + 1
    return pack_padded(rows, lengths, lo)


def shard_batch(batch: list[int], rank: int, world: int) -> list[int]:
    """This rank's part of a global batch (may be empty when the batch has fewer rows than ranks)."""
    return batch[rank::world]


class Prefetcher:
    """Loads the next batch in a background thread while the current step computes, so that on a
    GPU the read from disk and the first top-1 of its sequences overlap the step instead of
    stalling it. What is loaded does not depend on the timing: results are the same either way."""

    def __init__(self, load):
        self.load = load
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-lab-batch")
        self.pending: tuple[object, Future] | None = None

    def get(self, key, rows: list[int], after: tuple[object, list[int]] | None = None) -> Batch:
        """The batch of `rows` (loaded ahead if `key` was the last call's `after`); then starts
        loading `after` = (key, rows) for the next call."""
        hit = self.pending is not None and self.pending[0] == key
        future = self.pending[1] if hit else self.pool.submit(self.load, rows)
        self.pending = (after[0], self.pool.submit(self.load, after[1])) if after else None
        return future.result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
