"""Mutation review of atomic: which temps a write clears (only those of writers that are gone, of its
own form), and what a directory written whole leaves behind."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from drafter_lab import atomic
from drafter_lab.errors import LabError

NO_SUCH_PID = 2**22 + 1  # past Linux's largest pid_max: never a live process


def _temp(directory: Path, name: str, pid: int, host: str | None = None, rest: str = "k1ll3d00.tmp") -> Path:
    temp = directory / f".{name}.{pid}@{host or socket.gethostname()}.{rest}"
    temp.write_text("half")
    return temp


def test_the_temp_of_another_users_live_writer_is_left_alone(tmp_path, monkeypatch):
    """kill(pid, 0) on another user's process is EPERM: that writer is alive (a shared cache written by two
    users), and deleting its temp would fail its rename after all its work."""
    real_kill = os.kill
    live = 4242

    def kill(pid, sig):
        if pid == live:
            raise PermissionError(1, "Operation not permitted")
        return real_kill(pid, sig)

    monkeypatch.setattr(atomic.os, "kill", kill)
    theirs, gone = _temp(tmp_path, "f.json", live), _temp(tmp_path, "f.json", NO_SUCH_PID)
    atomic.write_json(tmp_path / "f.json", {"a": 1})
    assert theirs.exists() and not gone.exists()


def test_only_temps_of_the_exact_form_are_cleared(tmp_path):
    """A name that merely starts like a temp (a user's `.bak` of one, another host's, another file's) is not
    a temp of this path's writers."""
    gone = _temp(tmp_path, "f.json", NO_SUCH_PID)
    kept = [_temp(tmp_path, "f.json", NO_SUCH_PID, rest="k1ll3d00.tmp.bak"),
            _temp(tmp_path, "f.json", NO_SUCH_PID, rest="k1ll3d00.tmpx"),
            _temp(tmp_path, "f.json", NO_SUCH_PID, host="other-host"),
            _temp(tmp_path, "f.jsonl", NO_SUCH_PID)]
    atomic.write_text(tmp_path / "f.json", "{}")
    assert not gone.exists() and all(k.exists() for k in kept)


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_a_directory_written_over_a_file_leaves_no_temp(tmp_path, monkeypatch, swap):
    """The file that `path` was went to a temp that rmtree could not delete (not a directory), and stayed
    beside the output, the size of the file, until a later write of the same path."""
    if not swap:  # a system without renameat2's exchange
        monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.write_text("an earlier file")
    with atomic.atomic_dir(out) as d:
        (d / "f").write_text("new")
    assert (out / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_file_that_a_killed_directory_write_moved_aside_is_discarded(tmp_path):
    """Killed between the fallback's moves after the new directory landed: `.out.old` is the file `out` was.
    The next write discarded it with a rename over a directory, an IsADirectoryError traceback."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / ".out.old").write_text("the file out was")
    with atomic.atomic_dir(out) as d:
        (d / "f").write_text("new")
    assert (out / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
def test_a_json_file_that_cannot_be_read_is_one_line_naming_it():
    """A read error (EIO here; EACCES for another user's 0600 run files) was an OSError traceback."""
    with pytest.raises(LabError, match=r"^/proc/self/mem: cannot read it: Input/output error$"):
        atomic.read_json("/proc/self/mem", "missing")


def test_written_files_and_directories_get_the_modes_of_any_new_one(tmp_path):
    """mkstemp makes 0600 and mkdtemp 0700: an exported drafter read by a serving container running as
    another user was unreadable."""
    import torch

    atomic.write_text(tmp_path / "a.txt", "x")
    atomic.save_safetensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    with atomic.atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("x")
    for name in ("a.txt", "w.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~atomic._UMASK, name
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~atomic._UMASK


def test_only_a_mount_inside_a_directory_written_whole_refuses_it(tmp_path, monkeypatch):
    """A mount beside it whose name merely begins with its name (out and output) holds none of its files."""
    real = os.path.realpath(tmp_path)
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n36 22 8:1 /x {real}/output rw - ext4 /dev/sda1 rw\n")
    monkeypatch.setattr(atomic, "_MOUNTINFO", str(table))
    with atomic.atomic_dir(tmp_path / "out") as d:
        (d / "f").write_text("x")
    assert (tmp_path / "out" / "f").read_text() == "x"
    table.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n36 22 8:1 /x {real}/out/vol rw - ext4 /dev/sda1 rw\n")
    with pytest.raises(LabError, match=f"holds a mount point, {real}/out/vol,"), atomic.atomic_dir(tmp_path / "out"):
        pass


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be made")
def test_a_write_that_cannot_make_its_temp_says_where_it_tried(tmp_path):
    """Through a link the temp goes beside its target: the message names that directory, not the link's."""
    (tmp_path / "l.json").symlink_to("/proc/out.json")
    (tmp_path / "ldir").symlink_to("/proc/outdir")
    with pytest.raises(LabError, match=r"l.json: cannot write a file in /proc: "):
        atomic.write_text(tmp_path / "l.json", "x")
    with pytest.raises(LabError, match=r"^/proc/out.json: cannot write a file here: "):
        atomic.write_text("/proc/out.json", "x")
    with pytest.raises(LabError, match=r"ldir: cannot write a directory in /proc: "), atomic.atomic_dir(tmp_path / "ldir"):
        pass
    with pytest.raises(LabError, match=r"^/proc/outdir: cannot write a directory here: "), atomic.atomic_dir("/proc/outdir"):
        pass


def test_a_directory_holding_a_dangling_link_is_written(tmp_path):
    """Its files are fsynced before it lands; a link is not opened (a dangling one was a FileNotFoundError
    traceback after all the work), and lands as it was made."""
    with atomic.atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("x")
        (d / "latest").symlink_to("no-such-checkpoint")
    assert os.readlink(tmp_path / "d" / "latest") == "no-such-checkpoint"


@pytest.mark.parametrize("code", ["EINVAL", "EBADF"])
def test_a_file_system_that_cannot_fsync_a_directory_still_takes_the_write(tmp_path, monkeypatch, code):
    """Some network and overlay mounts refuse fsync on a directory: the rename stands without it."""
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    atomic.write_text(tmp_path / "a.txt", "x")
    with atomic.atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("y")
    assert (tmp_path / "a.txt").read_text() == "x" and (tmp_path / "d" / "f").read_text() == "y"


def test_a_json_path_below_a_file_reads_as_missing_naming_its_owner(tmp_path):
    """`--inputs results.json/best.json`: the missing file's message, not a NotADirectoryError traceback."""
    (tmp_path / "run").write_text("a file, not a run directory")
    with pytest.raises(LabError, match=rf"^{tmp_path}/run: not a run directory: best.json is missing$"):
        atomic.read_json(tmp_path / "run" / "best.json", "not a run directory: best.json is missing", tmp_path / "run")


def test_a_safetensors_file_starts_each_tensor_at_a_multiple_of_its_element_size(tmp_path):
    """Wider elements first, the data 8-byte aligned: a reader that maps the file (safetensors, vLLM) may view
    each tensor in place only where it is aligned."""
    import json

    import torch
    from safetensors.torch import load_file

    tensors = {"a_bytes": torch.arange(3, dtype=torch.uint8), "b_half": torch.ones(3, dtype=torch.float16),
               "c_float": torch.full((2,), 2.5), "d_double": torch.zeros(1, dtype=torch.float64)}
    for pad in range(8):  # headers of every length modulo 8
        atomic.save_safetensors(tensors, tmp_path / "t.safetensors", {"format": "pt", "pad": "x" * pad})
        raw = (tmp_path / "t.safetensors").read_bytes()
        n = int.from_bytes(raw[:8], "little")
        assert (8 + n) % 8 == 0, pad
    header = json.loads(raw[8:8 + n])
    starts = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    assert [k for _, k in starts] == ["d_double", "c_float", "b_half", "a_bytes"]
    for k, t in tensors.items():
        assert header[k]["data_offsets"][0] % t.element_size() == 0, k
    loaded = load_file(tmp_path / "t.safetensors")
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


def test_a_block_outside_its_tensors_rows_is_refused_not_written_over_another(tmp_path):
    """A negative row landed in the header or the tensor before; a block of part of a row shifted every row
    after it."""
    import torch

    with atomic.SafetensorsWriter(tmp_path / "t.safetensors", {"w": (torch.float32, [2, 3])}) as w:
        for row, block in ((-1, torch.ones(1, 3)), (0, torch.ones(4)), (1, torch.ones(2, 3))):
            with pytest.raises(ValueError, match="does not fit its layout"):
                w.write("w", row, block)
        w.write("w", 1, torch.full((1, 3), 2.0))
        w.write("w", 0, torch.ones(3))
    from safetensors.torch import load_file

    assert torch.equal(load_file(tmp_path / "t.safetensors")["w"], torch.tensor([[1.0] * 3, [2.0] * 3]))


def test_a_content_hash_of_json_does_not_depend_on_key_order():
    """It keys caches and fingerprints: the same settings built in another order are the same."""
    assert atomic.sha256_json({"a": 1, "b": {"x": 1, "y": 2}}) == atomic.sha256_json({"b": {"y": 2, "x": 1}, "a": 1})
    assert atomic.sha256_json({"a": 1}) != atomic.sha256_json({"a": 2})


def test_an_output_is_refused_inside_an_input_directory_only_over_a_file_the_lab_reads_there(tmp_path):
    """A file that is not there yet replaces nothing the run read; one the lab reads there is refused."""
    run = tmp_path / "run"
    run.mkdir()
    atomic.refuse_outputs([("--json", run / "best.json")], [("--inputs", run)])
    (run / "best.json").write_text("{}")
    (run / "eval.json").write_text("{}")
    atomic.refuse_outputs([("--json", run / "eval.json")], [("--inputs", run)])
    with pytest.raises(LabError, match=f"^{run}/best.json: --json would replace this file, which --inputs {run} reads$"):
        atomic.refuse_outputs([("--json", run / "best.json")], [("--inputs", run)])


def test_a_row_written_twice_is_refused_where_another_would_stay_zero(tmp_path):
    """The byte count alone took rows 0,0,2 of three for all three: row 1's zeros committed as data."""
    import torch
    from safetensors.torch import load_file

    layout = {"h": (torch.float32, (3, 2)), "s": (torch.int64, ())}
    with pytest.raises(ValueError, match=r"h: rows 0\.\.0 overlap rows written before"), \
            atomic.SafetensorsWriter(tmp_path / "a.safetensors", layout) as w:
        w.write("s", 0, torch.tensor(7))
        w.write("h", 0, torch.ones(1, 2))
        w.write("h", 2, torch.ones(1, 2))
        w.write("h", 0, torch.ones(1, 2))
    assert not (tmp_path / "a.safetensors").exists()
    with pytest.raises(ValueError, match=r"h: rows 1\.\.2 overlap"), atomic.SafetensorsWriter(tmp_path / "b.safetensors", layout) as w:
        w.write("h", 2, torch.ones(1, 2))
        w.write("h", 1, torch.ones(2, 2))
    with atomic.SafetensorsWriter(tmp_path / "c.safetensors", layout) as w:  # any order, each row once
        w.write("h", 2, torch.full((1, 2), 2.0))
        w.write("h", 0, torch.zeros(2, 2))
        w.write("s", 0, torch.tensor(7))
    assert load_file(tmp_path / "c.safetensors")["h"].tolist() == [[0, 0], [0, 0], [2, 2]]
