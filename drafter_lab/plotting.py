"""matplotlib for files only (no display on CI machines or in containers), and atomic PNG writes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from drafter_lab import atomic  # noqa: E402

__all__ = ["plt", "save_png"]


def save_png(fig, path: Path) -> None:
    """Write `fig` to `path` whole or not at all, and free it."""
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
