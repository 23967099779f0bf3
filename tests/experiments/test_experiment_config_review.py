"""`drafter-lab experiment`: settings this machine or the target preset cannot run, and directory options
below a file, are refused before a run directory or cache entry is made."""

from __future__ import annotations

import os

import pytest

from drafter_lab.cli import main


@pytest.mark.parametrize("flags, message", [
    (["--threads", str(4 * (os.cpu_count() or 1) + 1)], "--threads must be at most"),  # the flag typed
    (["--device", "foo"], "unknown device 'foo'"),
    (["--target-preset", "nope"], "unknown preset 'nope'"),
    (["--draft-vocab-size", "1000"], "--draft-vocab-size must be at most 512 (target preset micro's vocab size)"),
])
def test_refused_before_anything_is_written(tmp_path, capsys, flags, message):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    argv = ["experiment", "--config", "smoke", "--runs", str(runs), "--cache", str(cache), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
    assert not runs.exists() and not cache.exists()


def test_a_resumed_run_dir_is_not_made_for_a_refused_config(tmp_path, capsys):
    run_dir = tmp_path / "runs" / "mine"
    assert main(["experiment", "--config", "smoke", "--run-dir", str(run_dir), "--cache", str(tmp_path / "c"),
                 "--device", "foo"]) == 2
    assert not run_dir.exists()


@pytest.mark.parametrize("flag", ["--runs", "--run-dir", "--cache"])
def test_a_directory_below_a_file_is_one_line(tmp_path, capsys, flag):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "x"
    argv = ["experiment", "--config", "smoke", "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "cache"),
            flag, str(path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {path}: {flag} lies below a file, not a directory\n"
    assert not (tmp_path / "runs").exists()
