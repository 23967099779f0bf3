"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
