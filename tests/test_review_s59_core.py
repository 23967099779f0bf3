"""Review s59 (core): atomic writes run from a deleted current directory and over a mount point; a closed pipe
under a rich table."""

from __future__ import annotations

import json
import os
import shutil
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


MOUNTED = """
import sys
from pathlib import Path
from drafter_lab import atomic
from drafter_lab.errors import LabError
vol, file = Path(sys.argv[1]), Path(sys.argv[2])

def directory():
    with atomic.atomic_dir(vol) as tmp:
        (tmp / "f").write_text("new")

for name, write in (("dir", directory), ("file", lambda: atomic.write_json(file, {"a": 1})),
                    ("check", lambda: atomic.refuse_unwritable(file, "--json"))):
    try:
        write()
        print(name, "written")
    except LabError as e:
        print(name, "error:", e)
    except OSError as e:
        print(name, type(e).__name__, e)
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_mount_point_is_refused_in_one_line_before_anything_is_written(tmp_path):
    """`docker run -v $PWD/drafter:/out IMG export --out /out`: the temp went to the file system beneath the
    volume, and the final rename failed with OSError EBUSY, a traceback after all the work."""
    vol, file, src = tmp_path / "vol", tmp_path / "result.json", tmp_path / "src"
    vol.mkdir()
    file.write_text("old")
    src.mkdir()
    # the file: a tmpfs file bind-mounted over it; a private mount namespace keeps both from the host
    script = (f"mount -t tmpfs none {vol} && mount -t tmpfs none {src} && touch {src}/f && "
              f"mount --bind {src}/f {file} || exit 77; exec {sys.executable} -c \"$0\" {vol} {file}")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, MOUNTED],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode == 77 or "unshare failed" in r.stderr:
        pytest.skip(f"cannot mount here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{name} error: {path}: is a mount point, which cannot be replaced whole: "
                                     "name a path inside it" for name, path in (("dir", vol), ("file", file),
                                                                                ("check", file))]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "src", "vol"]  # no temp left
    assert file.read_text() == "old"



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
