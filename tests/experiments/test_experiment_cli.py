"""`drafter-lab experiment`: a config that would run no study is refused before anything runs."""

from __future__ import annotations

from drafter_lab.cli import main


def test_an_empty_drift_level_list_is_refused(tmp_path, capsys):
    argv = ["experiment", "--config", "smoke", "--drift-levels", "", "--runs", str(tmp_path / "runs"),
            "--cache", str(tmp_path / "cache")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: drift_levels is empty: give at least one drift level\n"
    assert not (tmp_path / "runs").exists()
