"""Mutation review s66 (h7) of atomic.py: a failed write leaves no temp, a write beside a live one of the
same process keeps it, the file is fsynced before its rename, writes that pwrite splits land whole, a
directory write falls back where the swap is refused, and the checks on outputs that lead where an input
or another output is, through links."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket

import pytest
import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError

NO_SUCH_PID = 2**22 + 1  # past Linux's largest pid_max: never a live process


def test_a_write_that_fails_leaves_no_temp(tmp_path):
    """The temp of a write whose body raised (a torch.save that ran out of disk) is deleted at once, not
    left the size of the file until the next write of that path."""
    (tmp_path / "s.pt").write_text("old")
    with pytest.raises(RuntimeError), atomic.atomic_path(tmp_path / "s.pt") as tmp:
        tmp.write_text("half")
        raise RuntimeError("the write failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"] and (tmp_path / "s.pt").read_text() == "old"


def test_a_second_write_of_a_path_keeps_the_temp_this_process_is_writing(tmp_path):
    """Two writes of one path in one process (a thread, a nested call): the second must not take the first
    one's temp, named for this pid, for a killed run's."""
    path = tmp_path / "best.json"
    with atomic.atomic_path(path) as tmp:
        tmp.write_text("first")
        atomic.write_text(path, "second")
        assert tmp.exists()
    assert path.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["best.json"]


def test_only_a_temp_named_for_this_path_alone_is_cleared(tmp_path):
    """The random part of a temp has no dot: `.a.<pid>@host.r1.<pid>@host.<random>.tmp` is a temp of a
    file named `a.<pid>@host.r1`, not of `a`, whatever pid its name starts with."""
    host = socket.gethostname()
    other = tmp_path / f".a.{NO_SUCH_PID}@{host}.r1.{os.getpid()}@{host}.k1ll3d00.tmp"
    other.write_text("not a's")
    atomic.write_text(tmp_path / "a", "x")
    assert other.exists()


def test_a_stale_temp_that_is_a_link_goes_without_what_it_leads_to(tmp_path):
    kept = tmp_path / "data"
    kept.mkdir()
    (kept / "f").write_text("keep")
    link = tmp_path / f".x.{NO_SUCH_PID}@{socket.gethostname()}.k1ll3d00.tmp"
    link.symlink_to(kept)
    atomic.write_text(tmp_path / "x", "new")
    assert not os.path.lexists(link) and (kept / "f").read_text() == "keep"


def test_a_file_is_fsynced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """Renamed before its bytes are on disk, a power loss leaves the new name on an empty file."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append(("fsync", os.fstat(fd).st_ino)), real_fsync(fd)))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(("move", os.stat(a).st_ino)), real_replace(a, b)))
    atomic.write_json(tmp_path / "run.json", {"a": 1})
    moved = [e for e in events if e[0] == "move"]
    assert len(moved) == 1 and ("fsync", moved[0][1]) in events[:events.index(moved[0])]


def test_a_safetensors_file_lands_whole_when_pwrite_writes_part_of_a_block(tmp_path, monkeypatch):
    """One pwrite moves at most ~2 GB: each next part goes where the last ended (a wide target's shard)."""
    from safetensors.torch import load_file

    real = os.pwrite
    monkeypatch.setattr(atomic.os, "pwrite", lambda fd, data, offset: real(fd, data[:5], offset))
    tensors = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.arange(5, dtype=torch.int16)}
    atomic.save_safetensors(tensors, tmp_path / "m.safetensors")
    loaded = load_file(tmp_path / "m.safetensors")
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


def test_a_file_hash_covers_every_chunk(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(bytes(range(256)) * 3)
    assert atomic.sha256_file(path, chunk=100) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_json_file_is_read_as_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(json.dumps({"template": "réponse → 答"}, ensure_ascii=False).encode())
    assert atomic.read_json(path, "missing") == {"template": "réponse → 答"}


class _Libc:
    def __init__(self, err: int):
        self.err = err

    def renameat2(self, *args):
        atomic.ctypes.set_errno(self.err)
        return -1


@pytest.mark.parametrize("code", ["ENOSYS", "EINVAL", "EOPNOTSUPP", None])
def test_a_directory_is_replaced_where_the_file_system_cannot_swap(tmp_path, monkeypatch, code):
    """A file system without RENAME_EXCHANGE (EINVAL from many), or a C library without renameat2 (None),
    takes the two moves instead."""
    path = tmp_path / "best"
    with atomic.atomic_dir(path) as d:
        (d / "f").write_text("old")
    libc = _Libc(getattr(errno, code)) if code else object()
    monkeypatch.setattr(atomic.ctypes, "CDLL", lambda *a, **k: libc)
    with atomic.atomic_dir(path) as d:
        (d / "f").write_text("new")
    assert (path / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_a_swap_that_fails_otherwise_is_an_error_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.ctypes, "CDLL", lambda *a, **k: _Libc(errno.EACCES))
    with pytest.raises(PermissionError) as e:
        atomic.exchange(tmp_path / "a", tmp_path / "b")
    assert e.value.filename == str(tmp_path / "b")


def test_a_path_two_levels_below_a_file_is_one_line_naming_it(tmp_path):
    """mkdir says ENOTDIR, not EEXIST, where the file is not the path's own parent."""
    (tmp_path / "f").write_text("a file")
    out = tmp_path / "f" / "sub" / "x.json"
    with pytest.raises(LabError, match=rf"^{out}: lies below a file, not a directory$"):
        atomic.write_text(out, "x")


def test_two_outputs_where_one_is_a_link_to_the_other_are_refused_before_either_exists(tmp_path):
    (tmp_path / "plot.png").symlink_to(tmp_path / "out.png")
    with pytest.raises(LabError, match="--plot and --json name the same file"):
        atomic.refuse_outputs([("--plot", tmp_path / "plot.png"), ("--json", tmp_path / "out.png")])


def test_an_output_linked_to_a_file_an_input_directory_holds_is_refused(tmp_path):
    """The write lands where the link leads: over the run's best.json, whatever the link is called."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.json").write_text("{}")
    (tmp_path / "cost.json").symlink_to(run / "best.json")
    with pytest.raises(LabError, match=rf"^{tmp_path}/cost.json: --json would replace this file, which --inputs"):
        atomic.refuse_outputs([("--json", tmp_path / "cost.json")], [("--inputs", run)])


@pytest.mark.parametrize("name", ["state.pt", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                  "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                                  "generation_config.json", "chat_template.jinja", "run.json", "results.json"])
def test_each_file_the_lab_reads_in_an_input_directory_is_refused_as_an_output(tmp_path, name):
    given = tmp_path / "dir"
    given.mkdir()
    (given / name).write_text("{}")
    with pytest.raises(LabError, match="would replace this file"):
        atomic.refuse_outputs([("--json", given / name)], [("--drafter", given)])


def test_a_directory_is_written_from_a_current_directory_deleted_already(tmp_path, monkeypatch):
    """A shell left in a directory another process deleted: no current directory to refuse, only a write."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with atomic.atomic_dir(tmp_path / "out") as d:
        (d / "f").write_text("x")
    assert (tmp_path / "out" / "f").read_text() == "x"
