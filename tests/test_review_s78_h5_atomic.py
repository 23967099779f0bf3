"""Mutation review s78 (h5) of drafter_lab/atomic.py: SafetensorsWriter's blocks of rows written out of
order, with gaps between them that later blocks fill."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from drafter_lab import atomic


def test_blocks_written_with_gaps_then_filling_them_land_whole(tmp_path):
    """A block merged into the span before it that it does not touch would claim the gap written: the
    block filling it then refused as an overlap, or the file committed with the gap's zeros."""
    rows = torch.arange(12, dtype=torch.float32).reshape(6, 2) + 1
    path = tmp_path / "s.safetensors"
    with atomic.SafetensorsWriter(path, {"h": (torch.float32, [6, 2])}) as w:
        for start, end in ((0, 1), (3, 4), (5, 6), (1, 3), (4, 5)):
            w.write("h", start, rows[start:end])
    assert torch.equal(load_file(str(path))["h"], rows)


def test_a_finished_directory_writes_temp_name_left_again_is_cleared(tmp_path):
    """Once atomic_dir ends, its temp's name is no longer one this process is writing: a directory of
    that name found later (a copy a killed child made) is stale, and the next write removes it."""
    path = tmp_path / "d"
    with atomic.atomic_dir(path) as tmp:
        (tmp / "f").write_text("1")
    tmp.mkdir()
    (tmp / "f").write_text("left")
    with atomic.atomic_dir(path) as again:
        (again / "f").write_text("2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and (path / "f").read_text() == "2"
