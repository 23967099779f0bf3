"""Output and input paths of the wrong kind, through the CLI: one line naming the path, exit code 2."""

from __future__ import annotations

import pytest

from drafter_lab import cli


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_costmodel_output_that_is_a_directory_or_below_a_file(tmp_path, capsys, flag):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    for path, says in ((tmp_path / "dir", "is a directory"), (tmp_path / "file" / "out", "lies below a file")):
        assert cli.main(["costmodel", flag, str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {path}: {says}" + (": give the path of a file to write" if says == "is a directory"
                                                   else ", not a directory")


def test_reproduce_of_a_file(tmp_path, capsys):
    f = tmp_path / "run.txt"
    f.write_text("")
    assert cli.main(["reproduce", str(f)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {f}: not a finished run: manifest.json is missing"
