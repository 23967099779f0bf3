"""An output that is a device or a pipe (`--json /dev/null`, a shell's `>(...)`) is written through: the
temp-and-rename replaced the node itself, and as root /dev/null became a plain file."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from drafter_lab import atomic


def test_a_pipe_is_written_through(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    atomic.refuse_outputs([("--json", fifo)])  # accepted before the work
    atomic.write_json(fifo, {"a": 1})
    reader.join(timeout=60)
    assert got and '"a": 1' in got[0]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temp left beside it


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_stays_a_device(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    atomic.write_text(null, "discarded")
    atomic.save_safetensors({}, null)
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]
