"""Review s65 of cli.py and locks.py: a command's exit code is the one a torchrun rank ends with, an
interrupted command exits 130 with one line, --trust-remote-code reaches the environment every loader
reads, and a second run refused a locked run directory is told which directory."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from drafter_lab import cli, locks
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import REMOTE_CODE_ENV


def _reproduce_of_a_file(tmp_path):
    f = tmp_path / "run.txt"
    f.write_text("")
    return ["reproduce", str(f)]


def test_a_rank_that_joined_torchrun_ends_with_the_commands_exit_code(tmp_path, monkeypatch, capsys):
    ended = []
    monkeypatch.setitem(sys.modules, "drafter_lab.train.distributed", SimpleNamespace(end_process=ended.append))
    assert cli.main(_reproduce_of_a_file(tmp_path)) == 2
    assert ended == [2]


def test_an_interrupted_command_exits_130_with_one_line(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    args = cli.build_parser().parse_args(_reproduce_of_a_file(tmp_path))
    monkeypatch.setattr(cli, "build_parser", lambda: SimpleNamespace(parse_args=lambda argv: args))
    monkeypatch.setattr(args, "func", interrupted)
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_trust_remote_code_is_set_where_the_loaders_read_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(REMOTE_CODE_ENV, "")  # restored after the test, whatever the flag sets
    monkeypatch.delenv(REMOTE_CODE_ENV)
    cli.main(_reproduce_of_a_file(tmp_path))
    assert REMOTE_CODE_ENV not in os.environ
    cli.main(["--trust-remote-code", *_reproduce_of_a_file(tmp_path)])
    assert os.environ[REMOTE_CODE_ENV] == "1"


def test_a_run_directory_in_use_is_named_in_the_refusal(tmp_path):
    run_dir = tmp_path / "run"
    with locks.building(run_dir / "study", "run directory"):
        with pytest.raises(LabError) as e:
            with locks.building(run_dir / "study", "run directory", wait=False):
                pass
    assert str(e.value) == f"{run_dir}: another run is using the run directory"
