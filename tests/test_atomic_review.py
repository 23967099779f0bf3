"""Review of the durability primitives: stale temps of a killed writer whose pid came back, with real
processes in their own pid namespaces (a restarted container), and the journal's reading of broken lines."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal

WRITER = """
import os, sys, time
from pathlib import Path
from drafter_lab import atomic
path = Path(sys.argv[1])
if sys.argv[2] == "killed":
    with atomic.atomic_path(path) as tmp:
        tmp.write_text("half")
        print(os.getpid(), tmp, flush=True)
        time.sleep(600)
atomic.write_text(path, "whole")
print(os.getpid(), flush=True)
"""


def _in_new_pid_namespace(*args: str) -> subprocess.Popen:
    """A process that is pid 1 of a pid namespace of its own, as a container's first process is."""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", WRITER, *args],
                            stdout=subprocess.PIPE, text=True)


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unshare --pid (root or user namespaces)")
def test_a_restarted_container_clears_the_temp_its_killed_run_left(tmp_path):
    """A container restarted after a kill gives its run the pid the killed one had: that pid is alive (it
    is the new run itself), yet the temp is the killed run's and must go, not stay for good."""
    path = tmp_path / "state.pt"
    killed = _in_new_pid_namespace(str(path), "killed")
    pid, tmp = killed.stdout.readline().split()
    killed.send_signal(signal.SIGKILL)  # unshare dies, and --kill-child takes its child with it
    killed.wait()
    killed.stdout.close()
    assert Path(tmp).exists() and Path(tmp).name.startswith(f".state.pt.{pid}@")
    again = _in_new_pid_namespace(str(path), "again")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0 and out.split() == [pid]  # the same pid as the killed run
    assert path.read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]  # the killed run's temp is gone


def test_a_temp_named_for_this_process_goes_unless_this_process_writes_it(tmp_path):
    host = socket.gethostname()

    def earlier(name: str) -> Path:  # what an earlier process with this pid left
        return tmp_path / f".{name}.{os.getpid()}@{host}.k1ll3d00.tmp"

    earlier("x").mkdir()
    (earlier("x") / "part").write_text("half")
    earlier("y").write_text("half")
    with atomic.atomic_dir(tmp_path / "x") as d:
        assert not earlier("x").exists()
        atomic.clear_stale_temps(tmp_path / "x")  # another write of x meanwhile: this one's temp stays
        (d / "f").write_text("whole")
    with atomic.atomic_path(tmp_path / "y") as f:
        assert not earlier("y").exists()
        atomic.clear_stale_temps(tmp_path / "y")
        f.write_text("whole")
    assert (tmp_path / "x" / "f").read_text() == "whole" and (tmp_path / "y").read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x", "y"]


def test_a_journal_of_bytes_that_are_not_text_is_a_one_line_error(tmp_path):
    """Not UTF-8 (another tool's `.partial`, a damaged disk) is refused like any broken line, not a traceback."""
    path = tmp_path / "out.jsonl.partial"
    path.write_bytes(b"\xff\xfe\x00 not a journal\n")
    assert Journal.settings_of(path) is None  # a caller asks this before it opens the journal
    with pytest.raises(LabError, match=f"^{path}: partial run made with other settings"):
        Journal(path, {"seed": 1})
    path.unlink()
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    with open(path, "ab") as f:
        f.write(b'{"n": "\xff"}\n{"n": 3}\n')
    with pytest.raises(LabError, match=f"^{path}: line 3 is not JSON"):
        Journal(path, {"seed": 1})
