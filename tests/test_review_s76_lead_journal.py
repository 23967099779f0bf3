"""Review of session 76 (lead): a journal the first append could not make (a directory this user may not
write, a dangling link in its place) is refused in one line when the run starts, before any work is done,
and a lock the file system refuses is one line too, not flock's traceback."""

from __future__ import annotations

import errno
import fcntl

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal

SETTINGS = {"seed": 1}


def refusal(path, **kw) -> str:
    with pytest.raises(LabError) as e:
        Journal(path, SETTINGS, **kw)
    assert e.value.exit_code == 2
    return str(e.value)


@pytest.mark.parametrize("below", ["", "new/deeper/"])
def test_a_journal_in_a_directory_this_user_may_not_write_is_refused_before_any_work(shut_out, below):
    """Before: the run did its first unit of work, then died in mkdir's or open's traceback."""
    scratch, as_nobody = shut_out
    locked = scratch / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    path = locked / below / "run.partial"
    with as_nobody():
        said = refusal(path, flag="--json")
        assert Journal(path, SETTINGS, write=False).records == []  # a reader makes nothing
    assert said == f"{path}: cannot make this journal: {locked} is not writable; use another --json"
    locked.chmod(0o755)
    with Journal(path, SETTINGS) as journal:  # the same path, once this user may write there
        journal.append({"n": 1})
    assert Journal(path, SETTINGS).records == [{"n": 1}]


def test_a_dangling_link_in_place_of_the_journal_is_refused_naming_its_target(tmp_path):
    """Before: the first append's exclusive open failed on the link and blamed "another run"."""
    path = tmp_path / "run.partial"
    path.symlink_to("gone/run.partial")
    assert refusal(path) == (f"{path}: is a link to gone/run.partial, which does not exist; "
                             "remove it or use another --out")
    path.unlink()
    (tmp_path / "away").symlink_to(tmp_path / "nowhere")
    deep = tmp_path / "away" / "run.partial"
    assert refusal(deep) == f"{deep}: cannot make this journal: {tmp_path / 'away'} is a broken link; use another --out"


def test_a_directory_made_unwritable_after_the_check_is_one_line_at_the_first_append(shut_out):
    scratch, as_nobody = shut_out
    (scratch / "out").mkdir()
    path = scratch / "out" / "run.partial"
    journal = Journal(path, SETTINGS)
    (scratch / "out").chmod(0o555)
    with as_nobody(), pytest.raises(LabError) as e:
        journal.append({"n": 1})
    assert str(e.value) == f"{path}: cannot make this journal: Permission denied; use another --out"
    assert not path.exists()


def test_a_lock_the_file_system_refuses_is_one_line_and_leaves_no_file_open(tmp_path, monkeypatch):
    """As on a network file system without locks (ENOLCK): before, flock's traceback."""
    path = tmp_path / "run.partial"
    with Journal(path, SETTINGS) as journal:
        journal.append({"n": 1})
    opened = []

    def no_locks(file, op):
        opened.append(file)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert refusal(path) == f"{path}: cannot lock this journal: No locks available; use another --out"
    assert opened and opened[0].closed
    monkeypatch.undo()
    assert Journal(path, SETTINGS).records == [{"n": 1}]
