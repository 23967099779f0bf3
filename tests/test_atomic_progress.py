"""Atomic writes keep normal file modes and clear what killed writers left; progress writes plain lines
where no terminal is attached."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drafter_lab import atomic
from drafter_lab.progress import log, progress


def test_atomic_writes_get_the_umask_modes(tmp_path):
    umask = os.umask(0o22)
    os.umask(umask)
    atomic.write_text(tmp_path / "a.txt", "x")
    # mkstemp makes 0600 temp files; what lands must look like any new file.
    atomic.save_safetensors({"w": torch.ones(2)}, tmp_path / "m.safetensors")
    atomic.torch_save({"step": 1}, tmp_path / "s.pt")
    for name in ("a.txt", "m.safetensors", "s.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    with atomic.atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("y")
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~umask
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left behind


KILLED_WRITER = """
import sys, time
from pathlib import Path
from drafter_lab import atomic
with (atomic.atomic_dir if sys.argv[2] == "dir" else atomic.atomic_path)(Path(sys.argv[1])) as tmp:
    (tmp / "part" if sys.argv[2] == "dir" else tmp).write_text("half")
    print(tmp, flush=True)
    time.sleep(600)
"""


def killed_writer(path: Path, kind: str) -> tuple[Path, int]:
    """A real process killed (SIGKILL) while it writes `path`: the temp it leaves, and its pid."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), kind], stdout=subprocess.PIPE, text=True)
    tmp = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert tmp.exists() and proc.returncode == -signal.SIGKILL
    return tmp, proc.pid


def test_the_next_write_clears_what_a_killed_writer_left(tmp_path):
    host = socket.gethostname()
    dir_tmp, dead = killed_writer(tmp_path / "x", "dir")
    file_tmp, _ = killed_writer(tmp_path / "y.json", "file")
    kept = [tmp_path / f".x.{os.getppid()}@{host}.abcd1234.tmp",  # a live writer's (another process)
            tmp_path / f".x.{dead}@elsewhere.abcd1234.tmp",  # another host's, on a shared cache
            tmp_path / f".x.5.{dead}@{host}.abcd1234.tmp",  # a temp of "x.5", not of "x"
            tmp_path / ".x.abcd1234.tmp"]  # a name of another form
    for k in kept:
        k.mkdir()
    with atomic.atomic_dir(tmp_path / "x") as d:
        (d / "f").write_text("whole")
    atomic.write_json(tmp_path / "y.json", {"whole": True})
    assert not dir_tmp.exists() and not file_tmp.exists()
    assert all(k.exists() for k in kept)
    assert (tmp_path / "x" / "f").read_text() == "whole" and not (tmp_path / "x" / "part").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(k.name for k in kept), "x", "y.json"])


def _dir_with(path: Path, text: str) -> Path:
    with atomic.atomic_dir(path) as d:
        (d / "f").write_text(text)
    return path


def test_a_directory_is_replaced_in_one_step(tmp_path, monkeypatch):
    """Over an existing directory the new one is swapped in (renameat2 RENAME_EXCHANGE), never moved
    aside first: a reader, or a run killed meanwhile, cannot find it missing. No move may happen here."""
    path = _dir_with(tmp_path / "best", "old")

    def no_move(*args):
        raise AssertionError(f"moved {args}: the directory was missing between two moves")

    monkeypatch.setattr(atomic.os, "replace", no_move)
    _dir_with(path, "new")
    assert (path / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_without_the_swap_a_write_killed_between_two_moves_is_undone(tmp_path, monkeypatch):
    """Where the system cannot swap, the old directory is moved aside first; a write killed after that
    leaves it there, and the next write of the path, even one that fails, puts it back first."""
    path = _dir_with(tmp_path / "best", "old")
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    real, moves = os.replace, []

    def killed_at_the_second(a, b):
        moves.append(b)
        if len(moves) == 2:
            raise KeyboardInterrupt  # what a kill between the moves leaves
        real(a, b)

    monkeypatch.setattr(atomic.os, "replace", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        _dir_with(path, "new")
    assert not path.exists()
    monkeypatch.setattr(atomic.os, "replace", real)
    with pytest.raises(RuntimeError), atomic.atomic_dir(path):
        raise RuntimeError("this write fails too")
    assert (path / "f").read_text() == "old"
    _dir_with(path, "new")
    assert (path / "f").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_progress_logs_lines_without_a_terminal(capsys):
    with progress("stage", 3, every_s=3600) as advance:
        advance()
        advance(loss=1.5)
        advance(loss=1.25)
    err = capsys.readouterr().err
    assert "stage 3/3" in err and "loss=1.25" in err  # the final line, always
    assert "stage 1/3" not in err  # nothing in between: every_s has not passed
    with progress("again", 2, every_s=3600) as advance:
        advance(loss=2.0)
        advance()  # the fields last given stay on the line
        advance(0, loss=1.0)  # a status after the end: no line now, one as the work closes
        advance(0, loss=0.5)
        assert capsys.readouterr().err.count("again 2/2") == 1
    err = capsys.readouterr().err  # eval's accept length came after its last prompt, and the log kept the one before
    assert err.count("again 2/2") == 1 and "again 2/2 [0 s] loss=0.5" in err
    with progress("quiet", 1, every_s=3600) as advance:
        advance(loss=3.0)
    assert capsys.readouterr().err.count("quiet 1/1") == 1  # nothing new at the close: no second line


def test_a_logged_line_stays_one_line_whatever_its_length(capsys):
    # A CI log or a test's capture is no terminal: a path longer than the console's 80 columns must not
    # be folded into pieces that grep and a reader can't put back together.
    path = "/" + "/".join(f"directory-{i}" for i in range(12)) + "/conversations.jsonl"
    log(f"{path}: 1 of 4 conversations hold answers another target sampled: they train as text")
    assert capsys.readouterr().err == f"{path}: 1 of 4 conversations hold answers another target sampled: " \
        "they train as text\n"


def test_safetensors_bytes_do_not_depend_on_the_process(tmp_path):
    # safetensors writes its metadata map in hash order; the same content must give the same bytes.
    from safetensors import safe_open

    tensors = {"w": torch.randn(3, 5), "ids": torch.arange(7), "h": torch.randn(4).bfloat16()}
    meta = {"format": "pt", "seq_ids": '["a", "é\\n"]', "layout": "sglang", "x": "1", "y": "2", "z": "∑"}
    blobs = set()
    for i in range(8):
        atomic.save_safetensors(tensors, tmp_path / f"{i}.safetensors", metadata=meta)
        blobs.add((tmp_path / f"{i}.safetensors").read_bytes())
    assert len(blobs) == 1
    with safe_open(str(tmp_path / "0.safetensors"), framework="pt") as f:
        assert f.metadata() == meta
        assert all(torch.equal(f.get_tensor(k), v) for k, v in tensors.items())


def test_safetensors_writer_round_trips_through_safetensors(tmp_path):
    from safetensors import safe_open

    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(7, 3, generator=g).bfloat16(),
        "u8": torch.randint(0, 255, (5,), dtype=torch.uint8, generator=g),  # odd length before wider tensors
        "i64": torch.randint(-9, 9, (3, 2), generator=g),
        "i32": torch.randint(-9, 9, (4,), generator=g).int(),
        "f16": torch.randn(2, 2, generator=g).half(),
        "f64": torch.randn(3, generator=g).double(),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).T,
    }
    atomic.save_safetensors(tensors, tmp_path / "m.safetensors", metadata={"k": "v"})
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        assert f.metadata() == {"k": "v"} and set(f.keys()) == set(tensors)
        for k, v in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and torch.equal(got, v), k


def test_safetensors_writer_fills_rows_in_any_order_and_lands_only_when_full(tmp_path):
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(1)
    x, ids = torch.randn(6, 4, generator=g), torch.randint(0, 99, (6,), generator=g)
    layout = {"x": (torch.bfloat16, [6, 4]), "ids": (torch.int32, [6])}
    with atomic.SafetensorsWriter(tmp_path / "a.safetensors", layout) as w:
        for a, b in ((4, 6), (0, 1), (1, 4)):  # out of order, converted on the way
            w.write("x", a, x[a:b])
            w.write("ids", a, ids[a:b])
    got = load_file(tmp_path / "a.safetensors")
    assert torch.equal(got["x"], x.bfloat16()) and torch.equal(got["ids"], ids.int())
    # Same content, same bytes as the one-shot writer.
    atomic.save_safetensors({"x": x.bfloat16(), "ids": ids.int()}, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()

    with pytest.raises(ValueError, match="never written"), atomic.SafetensorsWriter(tmp_path / "c.safetensors", layout) as w:
        w.write("x", 0, x)
    with pytest.raises(ValueError, match="does not fit"), atomic.SafetensorsWriter(tmp_path / "d.safetensors", layout) as w:
        w.write("x", 3, x[:4])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors"]  # no file, no temp
