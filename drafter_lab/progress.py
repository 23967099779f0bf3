"""Progress display for long work (rich), quiet enough for CI logs."""

from __future__ import annotations

import contextlib
import time

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


OWN_STYLES = ("[bold]", "[bold green]", "[yellow]", "[/]")
"""The markup log messages may hold; any other bracket is a value's (a path's `[v2]`, Mistral's `[/INST]`)."""


def log(message: str) -> None:
    """A status line on stderr (stdout is kept for results). Only OWN_STYLES are markup: rich dropped a
    value's brackets that read as a tag, and raised MarkupError on one that closed none."""
    text = escape(message)
    for tag in OWN_STYLES:
        text = text.replace(escape(tag), tag)
    try:
        console.print(text, highlight=False, soft_wrap=True)  # one line per message, paths unbroken, in logs too
    except MarkupError:  # a value holding one of our own tags: the line as written
        console.print(message, highlight=False, soft_wrap=True, markup=False)


@contextlib.contextmanager
def progress(description: str, total: int | None, every_s: float = 30.0):
    """Yield a callback `advance(n=1, **fields)`; `fields` shows as `key=value` after the bar.

    On a terminal this is a live bar. Elsewhere (CI logs, files) a live bar would only print when
    it finishes, so a plain line is written every `every_s` seconds and at the end instead."""
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    live = console.is_terminal
    with Progress(*columns, console=console, transient=False, disable=not live) as bar:
        task = bar.add_task(description, total=total, status="")
        start = last = time.monotonic()
        done = 0
        status = ""  # the fields last given, kept (as the live bar keeps them) until others come
        written = (0, "")  # the count and status of the last line: work never advanced writes none

        def line(status: str) -> None:
            nonlocal written
            of = f"/{total}" if total is not None else ""
            log(f"{description} {done}{of} [{time.monotonic() - start:.0f} s] {status}".rstrip())
            written = (done, status)

        def advance(n: int = 1, **fields) -> None:
            nonlocal done, last, status
            if fields:
                status = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
            bar.update(task, advance=n, status=status)
            done += n
            finishing = n and total is not None and done >= total  # once: a later status-only call waits
            if not live and (time.monotonic() - last >= every_s or finishing):
                last = time.monotonic()
                line(status)

        yield advance
        # Steps or fields since the last line: work that stopped short of its total (a run the watch
        # stopped) or has none, or fields given after the last step's line.
        if not live and (done, status) != written:
            line(status)


def maybe_progress(description: str, total: int, show: bool):
    """`progress(...)`, or a silent stand-in (ranks other than 0 stay quiet)."""
    return progress(description, total) if show else contextlib.nullcontext(lambda *args, **fields: None)
