"""A small causal-LM training loop for the target pair (pre-training `base`, fine-tuning `tuned`).

Conversations are rendered with the tokenizer's chat template and concatenated into one token
stream; each training window starts at a conversation start and runs on into the next ones
(packing), so the model sees the chat format from position 0 the way it will at inference, and no
token is padding.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drafter_lab.errors import LabError
from drafter_lab.progress import progress


@dataclass
class TokenStream:
    """Chat-formatted conversations as one int64 stream, and where each conversation begins."""

    ids: torch.Tensor
    starts: torch.Tensor

    def windows(self, seq_len: int) -> torch.Tensor:
        """Consecutive non-overlapping windows [n, seq_len] covering the stream (tail dropped)."""
        n = self.ids.numel() // seq_len
        return self.ids[: n * seq_len].view(n, seq_len)


def encode_conversations(tokenizer, records: list[dict]) -> TokenStream:
    texts = [tokenizer.apply_chat_template(r["conversations"], tokenize=False) for r in records]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    lengths = torch.tensor([len(e) for e in encoded], dtype=torch.long)
    starts = torch.cumsum(lengths, 0) - lengths
    ids = torch.tensor([t for e in encoded for t in e], dtype=torch.long)
    return TokenStream(ids=ids, starts=starts)


def sample_windows(stream: TokenStream, n: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """`n` windows of `seq_len + 1` tokens, each beginning at a randomly drawn conversation start."""
    valid = stream.starts[stream.starts + seq_len + 1 <= stream.ids.numel()]
    if valid.numel() == 0:
        raise LabError(f"training text too short: {stream.ids.numel()} tokens, window needs {seq_len + 1}")
    pick = valid[torch.randint(valid.numel(), (n,), generator=generator)]
    return stream.ids[pick[:, None] + torch.arange(seq_len + 1)]


def _lr_at(step: int, steps: int, peak: float, warmup: int, decay: bool) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    if not decay:
        return peak
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def train_lm(
    model: torch.nn.Module,
    sources: list[tuple[TokenStream, float]],
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float,
    warmup_steps: int,
    weight_decay: float,
    decay: bool,
    seed: int,
    description: str,
) -> dict:
    """Train `model` in place on windows mixed from `sources` (stream, share of each batch).

    Batch composition is fixed (the shares are rounded once), and windows come from one seeded
    generator, so a run is a deterministic function of (model init, data, seed).
    Returns loss figures and timing.
    """
    counts = [round(share * batch_size) for _, share in sources]
    counts[0] += batch_size - sum(counts)
    device = next(model.parameters()).device
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    )
    generator = torch.Generator().manual_seed(seed)
    opt = _optimizer(model, lr, weight_decay)
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    with progress(description, total=steps) as advance:
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, steps, lr, warmup_steps, decay)
            batch = torch.cat(
                [sample_windows(s, c, seq_len, generator) for (s, _), c in zip(sources, counts) if c]
            ).to(device)
            with autocast:
                logits = model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            advance(loss=losses[-1])
    model.eval()
    tail = losses[-max(1, steps // 10) :] if losses else []
    return {
        "steps": steps,
        "tokens": steps * batch_size * seq_len,
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "seconds": round(time.perf_counter() - start, 2),
    }
