"""Journal behaviours no test pinned (found by a mutation audit): settings named when not strict JSON and
compared as they read back, a refused journal lets its file go, settings_of on odd first lines, a half-written
or foreign first line, a record's NaN read back as null, parent directories made, a reader's discard."""

from __future__ import annotations

import json
import os
import re

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import _HEAD, Journal


def _holding(path) -> int:
    """How many of this process's open files are `path` (others' come and go in threads of their own)."""
    fds = "/proc/self/fd"
    return sum(os.path.realpath(os.path.join(fds, fd)) == str(path.resolve()) for fd in os.listdir(fds))


def test_settings_a_journal_cannot_write_are_named(tmp_path):
    path = tmp_path / "j"
    with pytest.raises(LabError, match=re.escape(f"{path}: settings temp, top hold a number JSON has not")):
        Journal(path, {"seed": 1, "temp": float("nan"), "top": [1, float("inf")]})
    assert not path.exists()


def test_settings_compare_as_they_read_back(tmp_path):
    """A tuple reads back as a list and a number key as text: the same settings resume, not refused."""
    path = tmp_path / "j"
    settings = {"ids": (1, 2), 3: "x"}
    with Journal(path, settings) as journal:
        journal.append({"n": 1})
    with Journal(path, dict(settings)) as journal:
        assert journal.records == [{"n": 1}]


def test_a_directory_is_refused_in_one_line(tmp_path):
    for write in (True, False):
        with pytest.raises(LabError, match=f"^{tmp_path}: is a directory, not a journal"):
            Journal(tmp_path, {}, write=write)


def test_a_refused_journal_lets_its_file_go(tmp_path):
    """Refused for other settings, a broken line, or another writer: the file it opened is closed (and so
    unlocked), not held until the refused object is collected; a run with the right settings goes on."""
    path = tmp_path / "j"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    with pytest.raises(LabError, match="other settings") as refused:
        Journal(path, {"seed": 2})
    assert _holding(path) == 0
    with Journal(path, {"seed": 1}) as journal:  # not "another run is writing": nothing holds the lock
        assert journal.records == [{"n": 1}]
        with pytest.raises(LabError, match="another run is writing") as refused:
            Journal(path, {"seed": 1})
        assert _holding(path) == 1  # this journal's own
    del refused


def test_settings_of_reads_a_settings_object_or_nothing(tmp_path):
    path = tmp_path / "j"
    assert Journal.settings_of(path) is None
    for first in ("[1]", '{"settings": [1]}', "not json"):
        path.write_text(first + "\n")
        assert Journal.settings_of(path) is None, first
    path.write_text('{"settings": {"a": 1}}\n{"n": 1}\n')
    assert Journal.settings_of(path) == {"a": 1}


def test_a_half_written_first_line_is_cut_and_a_foreign_one_kept(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(_HEAD + b'{"se')  # killed while writing its settings
    with Journal(path, {"seed": 1}) as journal:
        assert journal.records == []
        journal.append({"n": 1})
    assert path.read_text() == '{"settings": {"seed": 1}}\n{"n": 1}\n'
    path.write_text("hello")  # an input of one line, no newline: not this lab's, never cut
    with pytest.raises(LabError, match="is not a journal this lab wrote"):
        Journal(path, {"seed": 1})
    assert path.read_text() == "hello"


def test_a_records_nan_reads_back_as_null(tmp_path):
    path = tmp_path / "j"
    with Journal(path, {}) as journal:
        journal.append({"loss": float("nan"), "top": float("inf")})

    def strict(constant):
        raise AssertionError(f"{constant} in {path}: not strict JSON")

    assert [json.loads(line, parse_constant=strict) for line in path.read_text().splitlines()][1:] == \
        [{"loss": None, "top": None}]
    assert Journal(path, {}).records == [{"loss": None, "top": None}]


def test_the_first_append_makes_the_parent_directories(tmp_path):
    path = tmp_path / "a" / "b" / "j"
    with Journal(path, {}) as journal:
        assert not (tmp_path / "a").exists()  # nothing finished: nothing left behind
        journal.append({"n": 1})
    assert Journal(path, {}).records == [{"n": 1}]


def test_a_readers_discard_leaves_the_file(tmp_path):
    """Tensor-parallel ranks other than 0 read only: rank 0's journal is not theirs to remove."""
    path = tmp_path / "j"
    with Journal(path, {}) as journal:
        journal.append({"n": 1})
    Journal(path, {}, write=False).discard()
    assert Journal(path, {}).records == [{"n": 1}]
