"""Output and input paths of the wrong kind, through the CLI: one line naming the path, exit code 2."""

from __future__ import annotations

import pytest

from drafter_lab import cli


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_costmodel_output_that_is_a_directory_or_below_a_file(tmp_path, capsys, flag):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    for path, says in ((tmp_path / "dir", f"is a directory: {flag} takes a file to write"),
                       (tmp_path / "file" / "out", f"{flag} lies below a file, not a directory")):
        assert cli.main(["costmodel", flag, str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.err.strip() == f"error: {path}: {says}" and captured.out == ""  # refused before the report


def test_reproduce_of_a_file(tmp_path, capsys):
    f = tmp_path / "run.txt"
    f.write_text("")
    assert cli.main(["reproduce", str(f)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {f}: not a finished run: manifest.json is missing"


# String options that are not paths (names, choices, settings), so an empty one is theirs to judge.
NOT_PATHS = {"device", "dtype", "engine", "format", "fused", "model", "name", "preset", "schedule", "target_dtype",
             "turns", "verifier", "command", "ngram", "rest", "top"}


def _actions(parser, prefix=""):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{prefix}{name} ")
        else:
            yield prefix.strip(), action


def test_every_path_option_refuses_an_empty_path():
    """`train --out ''` wrote into the current directory, `data prepare --out ''` was a traceback,
    an empty --run-dir started a new run: every option naming a file or directory refuses "". A new
    string option must be classed here (a path in cli.PATH_DESTS, or NOT_PATHS)."""
    unclassed = []
    for command, action in _actions(cli.build_parser()):
        if action.nargs == 0 or action.dest.startswith("cfg__") or action.dest in ("help", "version"):
            continue
        if action.dest in cli.PATH_DESTS:
            assert action.type is cli.nonempty_path, (command, action.dest)
        elif action.type is None and action.dest not in NOT_PATHS:
            unclassed.append(f"{command} {action.option_strings or action.dest}")
    assert not unclassed, f"string options neither a path nor in NOT_PATHS: {unclassed}"


@pytest.mark.parametrize("argv", [
    ["train", "--target", "t", "--data", "d", "--out", ""],
    ["data", "prepare", "--target", "t", "--conversations", "c", "--out", ""],
    ["vocab", "compare", "", "b"],
    ["eval", "--ngram", "--target", "t", "--prompts", "", "--json", "j"],
    ["reproduce", ""],
])
def test_an_empty_path_is_refused_naming_its_option(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    assert "empty: name a file or directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
