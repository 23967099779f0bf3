"""Mutation review s77 (h1) of atomic.py: the import keeps the umask, a liveness probe sends no signal,
a finished write's temp is stale, the checks before the work (below a file, an unmakeable directory, a
device, pipe or directory this user cannot write), writes leak no descriptor, a failed directory fsync
is raised, read_json's messages, and the safetensors header's padding, metadata and empty blocks."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab import atomic
from drafter_lab.errors import LabError


def test_importing_the_module_leaves_the_process_umask_as_it_was():
    """The module reads the umask by setting it: it must set it back, or a process with umask 077 would
    make every later file (not only the lab's) readable by all."""
    code = "import os; os.umask(0o077); from drafter_lab import atomic; print(oct(os.umask(0)), oct(atomic._UMASK))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0o77", "0o77"]


BLOCKED = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # what is sent stays pending, in /proc
print("ready", flush=True)
sys.stdin.read()
"""


def test_asking_whether_a_writer_is_alive_sends_it_no_signal(tmp_path):
    """A live writer's temp is kept, and finding it alive (kill with signal 0) must not signal it: a
    SIGHUP would end it. It blocks every signal, so whatever was sent shows as pending."""
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        theirs = tmp_path / f".f.json.{proc.pid}@{socket.gethostname()}.abcd1234.tmp"
        theirs.write_text("half")
        atomic.write_text(tmp_path / "f.json", "whole")
        assert theirs.exists()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        pending = {k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines()) if k in ("SigPnd", "ShdPnd")}
        assert pending == {"SigPnd": "0000000000000000", "ShdPnd": "0000000000000000"}
    finally:
        proc.kill()
        proc.communicate()


def test_a_finished_writes_temp_name_left_again_is_cleared(tmp_path):
    """Once a write ends, its temp's name is no longer one this process is writing: a temp of that name
    found later (a copy a killed child made, a restored backup) is stale, and the next write removes it."""
    path = tmp_path / "f.json"
    with atomic.atomic_path(path) as tmp:
        tmp.write_text("1")
    tmp.write_text("left")
    atomic.write_text(path, "2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    with atomic.SafetensorsWriter(tmp_path / "w.safetensors", {}):
        [tmp] = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    tmp.write_text("left")
    atomic.save_safetensors({}, tmp_path / "w.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", "w.safetensors"]


def test_a_directory_named_relative_to_the_current_one_is_replaced(tmp_path, monkeypatch):
    """The swap's paths are relative to the current directory then (AT_FDCWD), as os.replace's are."""
    monkeypatch.chdir(tmp_path)
    for text in ("old", "new"):
        with atomic.atomic_dir("d") as d:
            (d / "f").write_text(text)
    assert (tmp_path / "d" / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_an_output_below_a_file_is_refused_and_its_nearest_directory_returned(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(LabError, match="--run lies below a file, not a directory"):
        atomic.refuse_below_file(tmp_path / "f" / "sub" / "out.json", "--run")
    assert atomic.refuse_below_file(tmp_path / "a" / "b" / "out.json") == tmp_path


def test_a_directory_that_cannot_be_made_is_one_line_naming_the_path():
    """/proc takes no new directory: mkdir's error, not a silent return with nothing made."""
    path = Path("/proc/drafter_lab_no_such_dir/out.json")
    with pytest.raises(LabError, match="cannot create its directory") as e:
        atomic.make_parent(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def _as_unprivileged(*checks: tuple[str, Path]) -> list[str]:
    """Run each (kind, path) check in a forked child whose user cannot write /dev or a root-owned
    directory: nobody where this is root (access(2) passes root everywhere), this user otherwise. (A new
    interpreter as nobody could not start: this one may live under root's 0700 home.)"""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report each check's outcome, a line each, and end without pytest's cleanup
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            out = []
            for kind, path in checks:
                try:
                    (atomic.refuse_unwritable(path, "--out") if kind == "refuse" else atomic.write_text(path, "x"))
                    out.append("ok")
                except LabError as e:
                    out.append(str(e).replace(str(path), "PATH"))
            os.write(w, "\n".join(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read().splitlines()
    os.waitpid(pid, 0)
    return got


@pytest.fixture
def locked():
    """A directory others may enter (pytest's tmp_path is 0700) but not write, holding a read-only pipe
    `ro.json` and a writable one `rw.json`."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for name, mode in (("ro.json", 0o444), ("rw.json", 0o666)):
            os.mkfifo(d / name)
            os.chmod(d / name, mode)  # past the umask
        os.chmod(d, 0o755 if os.geteuid() == 0 else 0o555)
        try:
            yield d
        finally:
            os.chmod(d, 0o755)


def test_a_device_or_pipe_is_checked_for_this_users_writes_not_for_a_new_file_beside_it(locked):
    """A device or pipe is written through, so it needs no temp beside it: /dev/null and a writable pipe
    in a directory this user cannot write pass the check; a pipe it cannot write is refused in one line."""
    assert _as_unprivileged(("refuse", Path(os.devnull)), ("refuse", locked / "rw.json"), ("refuse", locked / "ro.json")) == [
        "ok", "ok", "PATH: --out: this device or pipe takes no writes from this user"]


def test_a_new_file_in_a_directory_this_user_cannot_write_is_refused_before_the_work(locked):
    assert _as_unprivileged(("refuse", locked / "new.json")) == [
        f"PATH: --out: cannot write a file in {locked}: Permission denied"]


def test_a_device_is_written_with_a_temp_in_the_temp_directory_not_beside_it():
    """A user who may write /dev/null but not /dev: the write's temp goes to the temp directory."""
    assert _as_unprivileged(("write", Path(os.devnull))) == ["ok"]


def test_writes_leave_no_descriptor_open(tmp_path):
    """A long run writes thousands of files: one descriptor kept per write would end it at the limit."""
    fds = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        atomic.write_text(os.devnull, "x")
        atomic.write_text(tmp_path / "f.json", "x")
        with atomic.atomic_dir(tmp_path / "d") as d:
            (d / "f").write_text("x")
        atomic.save_safetensors({"w": torch.ones(2)}, tmp_path / "w.safetensors")
    assert set(os.listdir("/proc/self/fd")) == fds


def test_a_blocked_process_stays_alive_until_killed():
    """The signal-pending check above relies on a blocked process keeping SIGHUP pending, not ending."""
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        os.kill(proc.pid, signal.SIGHUP)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "ShdPnd:\t0000000000000001" in status and proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()



@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_a_directory_fsync_that_fails_for_another_reason_than_no_support_is_raised(tmp_path, monkeypatch, err):
    """Only a file system that cannot fsync a directory (EINVAL, EBADF) is let pass: an I/O error means the
    rename may not survive a power loss, and the write must not report success."""
    def fsync(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    with pytest.raises(OSError) as e:
        atomic._fsync_dir(tmp_path)
    assert e.value.errno == err


def test_a_missing_json_file_without_an_owner_is_named_itself(tmp_path):
    with pytest.raises(LabError, match=rf"^{tmp_path}/none.json: no such file$"):
        atomic.read_json(tmp_path / "none.json", "no such file")


def test_a_directory_read_as_json_is_one_line_naming_it(tmp_path):
    with pytest.raises(LabError, match=rf"^{tmp_path}: is a directory, not a JSON file$"):
        atomic.read_json(tmp_path, "missing")


def _header(path: Path) -> dict:
    blob = path.read_bytes()
    return json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])


def test_a_safetensors_header_is_padded_to_8_bytes_and_has_no_null_metadata(tmp_path):
    """The data starts 8-byte aligned, whatever the header's length; `"__metadata__": null` is no map of
    strings, as the format has it: without metadata the entry is left out."""
    for name in ("w", "w1", "w12", "w123", "w1234"):
        atomic.save_safetensors({name: torch.ones(2)}, tmp_path / f"{name}.safetensors")
        assert len((tmp_path / f"{name}.safetensors").read_bytes()) % 8 == 0, name  # 8 + header + 8 data bytes
        assert list(_header(tmp_path / f"{name}.safetensors")) == [name]
    atomic.save_safetensors({"w": torch.ones(2)}, tmp_path / "m.safetensors", {"format": "pt"})
    assert _header(tmp_path / "m.safetensors")["__metadata__"] == {"format": "pt"}


def test_an_empty_block_of_rows_claims_no_row(tmp_path):
    """A capture's empty batch writes no rows at its offset: the rows around it are written later, whole."""
    path = tmp_path / "x.safetensors"
    with atomic.SafetensorsWriter(path, {"x": (torch.float32, [5, 2])}) as w:
        w.write("x", 3, torch.empty(0, 2))
        w.write("x", 0, torch.arange(10.0).reshape(5, 2))
    assert torch.equal(load_file(path)["x"], torch.arange(10.0).reshape(5, 2))


def test_a_directory_holding_the_current_one_is_refused_before_it_is_touched(tmp_path, monkeypatch):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "d" / "sub")
    with pytest.raises(LabError, match="holds\\) the current directory"), atomic.atomic_dir(tmp_path / "d"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and (tmp_path / "d" / "sub").is_dir()
