"""The journal keeps whole records only, refuses other settings, and exists only once it holds work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal


def test_records_survive_and_a_half_line_is_cut_at_the_next_append(tmp_path):
    path = tmp_path / "run.partial"
    with Journal(path, {"seed": 1}) as journal:
        assert journal.records == [] and not path.exists()  # nothing finished: no file
        journal.append({"n": 1})
        journal.append({"n": 2, "text": "ü"})
    with open(path, "a") as f:
        f.write('{"n": 3, "te')  # a kill mid-line
    reader = Journal(path, {"seed": 1}, write=False)
    assert reader.records == [{"n": 1}, {"n": 2, "text": "ü"}]
    reader.append({"n": 9})  # a read-only journal never touches the file
    assert path.read_text().endswith('{"n": 3, "te')
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 3})
    assert Journal(path, {"seed": 1}).records == [{"n": 1}, {"n": 2, "text": "ü"}, {"n": 3}]
    journal.discard()
    assert not path.exists()


def test_other_settings_and_a_broken_line_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "run.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    with pytest.raises(LabError, match=f"^{path}: partial run made with other settings"):
        Journal(path, {"seed": 2})
    path.write_text(path.read_text() + "not json\n" + '{"n": 2}\n')
    with pytest.raises(LabError, match=f"^{path}: line 3 is not JSON"):
        Journal(path, {"seed": 1})


def test_a_second_writer_is_refused_until_the_first_lets_go(tmp_path):
    path = tmp_path / "run.partial"
    first, second = Journal(path, {"seed": 1}), Journal(path, {"seed": 1})  # no file yet: both start
    first.append({"n": 1})
    with pytest.raises(LabError, match=f"^{path}: another run began this journal"):
        second.append({"n": 9})
    with pytest.raises(LabError, match=f"^{path}: another run is writing this journal"):
        Journal(path, {"seed": 1})
    assert Journal(path, {"seed": 1}, write=False).records == [{"n": 1}]  # a tensor-parallel reader still reads
    first.close()
    with Journal(path, {"seed": 1}) as again:
        again.append({"n": 2})
    assert path.read_text().splitlines()[1:] == ['{"n": 1}', '{"n": 2}']
    held = Journal(path, {"seed": 1})
    held.discard()
    assert not path.exists() and Journal(path, {"seed": 1}).records == []


def test_another_process_writing_is_refused_until_it_dies(tmp_path):
    path = tmp_path / "run.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    code = (f"from drafter_lab.journal import Journal; j = Journal({str(path)!r}, {{'seed': 1}}); print(flush=True); "
            "import time; time.sleep(60)")
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        writer.stdout.readline()  # it holds the journal
        with pytest.raises(LabError, match="another run is writing this journal"):
            Journal(path, {"seed": 1})
    finally:
        writer.kill()
        writer.wait()
    assert Journal(path, {"seed": 1}).records == [{"n": 1}]  # the kernel dropped a killed run's lock


def test_the_advice_names_the_flag_that_names_the_output(tmp_path):
    path = tmp_path / "sweep.json.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    with pytest.raises(LabError, match=r"delete it or use another --json$"):
        Journal(path, {"seed": 2}, flag="--json")
    path.write_text("not a journal")  # no whole line, and no journal's beginning
    with pytest.raises(LabError, match=r"move it away or use another --json$"):
        Journal(path, {"seed": 1}, flag="--json")
    with pytest.raises(LabError, match=r"is a directory, not a journal; use another --json$"):
        Journal(tmp_path, {"seed": 1}, flag="--json")
