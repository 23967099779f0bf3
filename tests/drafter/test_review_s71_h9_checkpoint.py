"""The target fingerprint a run record holds is checked where it is read (review s71 h9)."""
import json

import pytest

from drafter_lab.drafter.checkpoint import recorded_fingerprint
from drafter_lab.drafter.transfer import check_source_target
from drafter_lab.errors import LabError


@pytest.mark.parametrize("fingerprint", [123, ["abc"], {"sha256": "abc"}, True])
def test_a_recorded_fingerprint_that_is_no_string_is_one_line_naming_run_json(tmp_path, fingerprint):
    """A hand-edited 123 reached the pairing check as "drafter was trained on target 123", and a
    --source-target check as a fingerprint no directory has."""
    (tmp_path / "run.json").write_text(json.dumps({"config": {}, "target": {"fingerprint": fingerprint}}))
    said = f"{tmp_path / 'run.json'}: run record's target.fingerprint is {fingerprint!r}, not a string"
    with pytest.raises(LabError) as e:
        recorded_fingerprint(tmp_path)
    assert str(e.value) == said
    with pytest.raises(LabError) as e:  # it had been taken as given: no weights to check it against
        check_source_target(tmp_path, tmp_path / "no-such-target")
    assert str(e.value) == said


@pytest.mark.parametrize("target, fingerprint", [({"fingerprint": None}, None), ({}, None),
                                                 ({"fingerprint": "sha256:ab"}, "sha256:ab")])
def test_a_recorded_fingerprint_that_is_null_or_text_is_read_as_before(tmp_path, target, fingerprint):
    (tmp_path / "run.json").write_text(json.dumps({"config": {}, "target": target}))
    assert recorded_fingerprint(tmp_path) == fingerprint
