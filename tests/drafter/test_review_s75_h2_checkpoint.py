"""Review s75 h2: mutation audit of checkpoint.py's run-record readers (export's serving settings,
run_record, _recorded_depth, recorded_target)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.drafter.checkpoint import recorded_target
from drafter_lab.errors import LabError


def test_recorded_target_reads_the_record_it_is_given_not_the_file_again(tmp_path):
    """export passes the record it read already: that one is the record, even where the file now says otherwise."""
    (tmp_path / "run.json").write_text(json.dumps({"config": {}, "target": {"architecture": "OnDisk"}}))
    assert recorded_target(tmp_path, "architecture", {"target": {"architecture": "Given"}}) == "Given"
    assert recorded_target(tmp_path, "architecture") == "OnDisk"
    with pytest.raises(LabError) as e:  # the record given is checked as the file's is
        recorded_target(tmp_path, "architecture", {"target": {"architecture": 7}})
    assert str(e.value) == f"{tmp_path / 'run.json'}: run record's target.architecture is 7, not a string"
