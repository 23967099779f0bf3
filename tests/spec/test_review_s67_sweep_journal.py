"""A sweep journal holding a line that is no sweep record is refused in one line naming it (a KeyError
traceback)."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.spec.sweep import run_sweep


@pytest.mark.parametrize("record", [{"setting": {"steps": 1}}, {"n": 1}, [1, 2]])
def test_a_record_that_is_no_sweep_record_is_refused(tmp_path, record):
    path = tmp_path / "sweep.json.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append(record)
    with Journal(path, {"seed": 1}) as journal, pytest.raises(
            LabError, match=f"^{path}: holds a line that is no sweep record"):
        run_sweep([{"steps": 1}], lambda s: pytest.fail("decoded"), journal)
