"""Progress display for long work (rich), quiet enough for CI logs."""

from __future__ import annotations

import contextlib

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


def log(message: str) -> None:
    """A status line on stderr (stdout is kept for results)."""
    console.print(message, highlight=False)


@contextlib.contextmanager
def progress(description: str, total: int | None):
    """Yield a callback `advance(n=1, **fields)`; `fields` shows as `key=value` after the bar."""
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, status="")

        def advance(n: int = 1, **fields) -> None:
            status = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
            bar.update(task, advance=n, **({"status": status} if fields else {}))

        yield advance
