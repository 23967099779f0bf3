"""Mutation review s66 (h7) of progress.py: the plain lines' timing and elapsed seconds, the fields kept
from one step to the next, the closing line of work that stops short of its total (or has none), the
live bar on a terminal, and the log's own yellow markup."""

from __future__ import annotations

import io
import types

import pytest
from rich.console import Console

from drafter_lab import progress as progress_module
from drafter_lab.progress import log, progress


@pytest.fixture
def clock(monkeypatch):
    """A clock the test moves: `clock.now` seconds."""
    fake = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(monotonic=lambda: fake.now))
    return fake


def test_a_line_is_written_each_time_every_s_has_passed_with_the_seconds_since_the_start(capsys, clock):
    with progress("w", 5, every_s=10) as advance:
        for now in (5, 10, 15, 25, 26):
            clock.now = now
            advance()
    assert capsys.readouterr().err == "w 2/5 [10 s]\nw 4/5 [25 s]\nw 5/5 [26 s]\n"


def test_a_step_without_fields_keeps_the_fields_last_given(capsys):
    with progress("again", 2, every_s=3600) as advance:
        advance(loss=2.0)
        advance()
    assert capsys.readouterr().err == "again 2/2 [0 s] loss=2\n"


@pytest.mark.parametrize(("total", "fields", "line"), [(10, {"loss": 1.5}, "train 3/10 [0 s] loss=1.5"),
                                                       (10, {}, "train 3/10 [0 s]"), (None, {}, "scan 3 [0 s]")])
def test_work_that_ends_short_of_its_total_or_of_none_logs_its_count_as_it_closes(capsys, total, fields, line):
    """A run stopped early (the watch's --stop-if-behind) or work of no known total, done within every_s of
    its last line, logged nothing at its end: the log's last count was an older one, or there was none."""
    with progress(line.split()[0], total, every_s=3600) as advance:
        advance(2)
        advance(**fields)
    assert capsys.readouterr().err == line + "\n"


def test_fields_given_after_the_last_step_s_line_are_logged_as_the_work_closes(capsys):
    with progress("eval", 2, every_s=3600) as advance:
        advance(2)
        advance(0, accept=2.5)
    assert capsys.readouterr().err == "eval 2/2 [0 s]\neval 2/2 [0 s] accept=2.5\n"


def test_work_never_advanced_logs_nothing(capsys):
    with progress("idle", 4, every_s=3600):
        pass
    assert capsys.readouterr().err == ""


def test_on_a_terminal_the_live_bar_shows_the_count_and_fields_and_no_plain_lines(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(progress_module, "console", Console(file=out, force_terminal=True, width=200))
    with progress("stage", 3, every_s=0) as advance:
        advance()
        advance(loss=1.5)
        advance()
    shown = out.getvalue()
    assert "3/3" in shown and "loss=1.5" in shown and "[0 s]" not in shown


def test_without_a_terminal_only_the_plain_lines_are_written(capsys):
    with progress("stage", 3, every_s=3600) as advance:
        advance(3, loss=1.25)
    assert capsys.readouterr().err == "stage 3/3 [0 s] loss=1.25\n"


def test_the_logs_own_yellow_markup_styles_and_is_not_printed(capsys):
    log("[yellow]watch:[/] behind the baseline [v2]")
    assert capsys.readouterr().err == "watch: behind the baseline [v2]\n"
