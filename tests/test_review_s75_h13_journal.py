"""Review of session 75 (h13): a journal file that cannot be opened (no permission, a link loop, a path
through a file) is one line naming it, not open's traceback, whether the run writes it or only reads it."""

from __future__ import annotations

import contextlib

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal

SETTINGS = {"seed": 1}


def refusal(path, write: bool) -> str:
    with pytest.raises(LabError) as e:
        Journal(path, SETTINGS, write=write)
    assert e.value.exit_code == 2
    return str(e.value)


@pytest.fixture
def locked_out(shut_out):
    """locked_out(mode): a journal of `mode`, and a context opened by a user the mode keeps out."""
    scratch, as_nobody = shut_out

    @contextlib.contextmanager
    def journal(mode: int):
        path = scratch / "run.partial"
        with Journal(path, SETTINGS) as written:
            written.append({"n": 1})
        path.chmod(mode)
        with as_nobody():
            yield path

    return journal


def test_an_unreadable_journal_is_one_line_naming_it(locked_out):
    with locked_out(0) as path:
        wrote = refusal(path, write=True)
        read = refusal(path, write=False)  # a tensor-parallel rank other than 0
    assert wrote == f"{path}: cannot read and write this journal: Permission denied; use another --out"
    assert read == f"{path}: cannot read this journal: Permission denied; use another --out"


def test_a_journal_this_user_may_read_but_not_write_is_refused_only_to_a_writer(locked_out):
    with locked_out(0o444) as path:
        wrote = refusal(path, write=True)
        assert Journal(path, SETTINGS, write=False).records == [{"n": 1}]
    assert wrote == f"{path}: cannot read and write this journal: Permission denied; use another --out"


@pytest.mark.parametrize("write", [True, False])
def test_a_link_loop_in_place_of_the_journal_is_one_line_naming_it(tmp_path, write):
    """A reader took it for no journal at all (Path.exists is False on a loop), and a writer died in a traceback."""
    path = tmp_path / "run.partial"
    path.symlink_to(path.name)
    said = "cannot read and write this journal" if write else "cannot read this journal"
    assert refusal(path, write) == f"{path}: {said}: Too many levels of symbolic links; use another --out"


def test_a_journal_path_through_a_file_is_one_line_naming_the_flag(tmp_path):
    (tmp_path / "out").write_text("a file, not a directory")
    path = tmp_path / "out" / "run.partial"
    with pytest.raises(LabError) as e:
        Journal(path, SETTINGS, flag="--json")
    assert str(e.value) == f"{path}: cannot read and write this journal: Not a directory; use another --json"
    assert refusal(path, write=False) == f"{path}: cannot read this journal: Not a directory; use another --out"


def test_a_journal_not_yet_made_is_still_no_error(tmp_path):
    """The refusals above are open's other errors: a missing file is still an empty journal, made at the first append."""
    path = tmp_path / "new" / "run.partial"
    assert Journal(path, SETTINGS, write=False).records == []
    with Journal(path, SETTINGS) as journal:
        assert journal.records == [] and not path.exists()
        journal.append({"n": 1})
    assert Journal(path, SETTINGS).records == [{"n": 1}]
