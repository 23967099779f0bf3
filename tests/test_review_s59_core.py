"""Review s59 (core): an atomic write run from a deleted current directory (one over a mount point: in
test_review_s60_atomic.py, with the bind mounts); a closed pipe under a rich table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from drafter_lab import atomic


def test_a_directory_write_from_a_deleted_current_directory_lands(tmp_path, monkeypatch):
    """A shell left in a directory removed meanwhile (an old run's, deleted from another terminal): the check
    for writing over the current directory was os.getcwd()'s FileNotFoundError, for any --out at all."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with atomic.atomic_dir(tmp_path / "out") as tmp:
        (tmp / "f").write_text("x")
    assert (tmp_path / "out" / "f").read_text() == "x"


def test_a_reader_that_closes_the_pipe_on_a_rich_table_ends_as_on_a_print(tmp_path):
    """`drafter-lab watch RUN --baseline B | head -1`: rich's Console exited with status 1 (`reproduce`'s
    "metrics differ") where a plain print's closed pipe ends the command with 141."""
    for name, accs in (("base", (0.5, 0.6, 0.7)), ("run", (0.3, 0.3, 0.3))):
        (tmp_path / name).mkdir()
        rows = [{"split": "val", "step": 10 * (i + 1), "cond_acc_0": a} for i, a in enumerate(accs)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.Popen([sys.executable, "-m", "drafter_lab", "watch", str(tmp_path / "run"), "--baseline",
                          str(tmp_path / "base")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # long before the command prints: its imports take far longer
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == "", err


@pytest.mark.parametrize("value", ["/data/sharegpt[v2]/c.jsonl", "[INST] hi [/INST]", "[red]"])
def test_a_logged_value_keeps_its_brackets(value):
    """rich read a value's brackets as markup: `[v2]` was dropped from a path, and Mistral's `[/INST]`
    raised MarkupError, a traceback from a status line."""
    from drafter_lab.progress import console, log

    with console.capture() as out:
        log(f"[bold]reading[/] {value}")
    assert out.get().rstrip("\n") == f"reading {value}"
    with console.capture() as out:  # one of our own tags in a value: the line as written, not a traceback
        log(f"[bold]reading[/] x[/]{value}")
    assert f"x[/]{value}" in out.get()
