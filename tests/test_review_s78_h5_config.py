"""Mutation review s78 (h5) of drafter_lab/config.py: a field annotated with a bare list or tuple read as
typing.List's (a flag's "a,b" split, a file's string refused)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError


@dataclass
class Bare:
    names: list = dataclasses.field(default_factory=list)
    """Names, without an item type."""
    pair: tuple = ()
    """A pair, without an item type."""


def test_a_bare_list_or_tuple_field_splits_a_flags_value():
    """It stayed the string "a,b": a list field holding a str, each character an item to its users."""
    parser = argparse.ArgumentParser()
    labconfig.add_cli_args(parser, Bare)
    cfg = labconfig.apply_cli_args(Bare(), parser.parse_args(["--names", "a,b", "--pair", "x,y"]))
    assert cfg == Bare(names=["a", "b"], pair=("x", "y"))


def test_a_files_string_for_a_bare_list_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('names = "a,b"\n')
    with pytest.raises(LabError) as e:
        labconfig.load_toml(Bare, path)
    assert str(e.value) == f"{path}: names: cannot read 'a,b' as a list"
    path.write_text('names = ["a", "b"]\npair = ["x", "y"]\n')
    assert labconfig.load_toml(Bare, path) == Bare(names=["a", "b"], pair=("x", "y"))


def test_an_empty_config_path_is_refused_as_naming_no_file(tmp_path, monkeypatch):
    """An unset $CFG: Path("") is the current directory, which was "cannot read the config file: Is a
    directory" naming "."."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LabError) as e:
        labconfig.load_toml(Bare, "")
    assert str(e.value) == "an empty path names no config file"


def test_a_missing_config_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "nothing.toml"
    with pytest.raises(LabError) as e:
        labconfig.load_toml(Bare, path)
    assert (str(e.value), e.value.path) == (f"{path}: config file not found", str(path))


def test_a_complaint_whose_path_is_a_field_given_names_its_flag_once():
    """A check naming the setting as its error's path: the path becomes the flag, its body kept whole."""
    with pytest.raises(LabError) as e, labconfig.flags_named({"draft_tokens": "--draft-tokens"}):
        raise LabError("must be >= 1, got 0", "draft_tokens")
    assert (str(e.value), e.value.path) == ("--draft-tokens: must be >= 1, got 0", "--draft-tokens")
