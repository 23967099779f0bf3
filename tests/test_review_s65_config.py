"""Mutation review of the config machinery: field docs for --help, what command-line strings read as,
the shared checks' bounds, and which complaints get a flag's name."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError


@dataclass
class Base:
    steps: int = 1
    """Steps of the base."""
    ratio: float = 0.5
    """A ratio that takes
    two lines,   with 100% of   its spaces."""


@dataclass
class Derived(Base):
    steps: int = 2
    """Steps of the derived class."""
    pair: tuple[int, ...] = (1, 2)
    """A pair."""
    limit: int | None = None
    """Cap."""
    flag: bool = False
    """Switch."""
    out: Path = Path("o")
    """Where."""
    skipped: str = ""
    """Not a flag."""


@dataclass
class Other:
    steps: int = 7
    """Another config's steps."""


def test_field_docs_are_one_line_each_and_a_subclass_redefines_its_own():
    docs = labconfig.field_docs(Derived)
    assert docs["steps"] == "Steps of the derived class."
    assert docs["ratio"] == "A ratio that takes two lines, with 100% of its spaces."


def test_the_cli_reads_none_null_and_booleans_in_any_case_and_a_tuple_as_a_tuple():
    cfg = labconfig.replace(Derived(limit=3), limit="None", flag="TRUE", pair="3,4")
    assert cfg.limit is None and cfg.flag is True and cfg.pair == (3, 4)
    assert labconfig.replace(Derived(limit=3), limit="NULL").limit is None
    assert labconfig.replace(Derived(flag=True), flag="Off").flag is False


def test_to_dict_writes_a_path_as_text():
    """It goes into run.json and the report: a PosixPath is not JSON."""
    assert labconfig.to_dict(Derived()) == {"steps": 2, "ratio": 0.5, "pair": (1, 2), "limit": None, "flag": False,
                                            "out": "o", "skipped": ""}


def test_cli_args_skip_what_is_asked_show_docs_with_percent_and_apply_only_their_own_fields():
    """One parser may hold two configs with a field of the same name: each takes only its own `--x`."""
    parser = argparse.ArgumentParser()
    labconfig.add_cli_args(parser, Derived, skip=("skipped",))
    assert "100% of its spaces" in parser.format_help()  # a bare % was argparse's ValueError
    with pytest.raises(SystemExit):
        parser.parse_args(["--skipped", "x"])
    args = parser.parse_args(["--steps", "5", "--limit", "9"])
    assert labconfig.apply_cli_args(Derived(), args) == Derived(steps=5, limit=9)
    assert labconfig.apply_cli_args(Other(), args) == Other(steps=5)


def test_counts_below_one_and_numbers_below_zero_or_not_finite_are_refused():
    @dataclass
    class Counts:
        n: int = 1
        x: float = 0.0

    labconfig.check_counts(Counts(1, 0.0), ("n",), ("x",))
    with pytest.raises(LabError, match=r"^n must be >= 1, got 0$"):
        labconfig.check_counts(Counts(0, 0.0), ("n",), ("x",))
    for bad in (-1e-9, math.inf, math.nan):
        with pytest.raises(LabError, match="^x must be >= 0 and finite"):
            labconfig.check_counts(Counts(1, bad), ("n",), ("x",))


def test_a_seed_is_any_value_torch_takes():
    for seed in (-(2**63), 0, 2**64 - 1):
        labconfig.check_seed(seed)
    for seed in (-(2**63) - 1, 2**64):
        with pytest.raises(LabError, match=r"^--seed must be in -2\*\*63..2\*\*64-1"):
            labconfig.check_seed(seed, "--seed")


def test_a_complaint_naming_a_file_keeps_it_and_one_naming_no_field_is_raised_as_it_was():
    flags = {"lr": "--lr", "val_fraction": "--val-fraction"}
    with pytest.raises(LabError) as e, labconfig.flags_named(flags):
        raise LabError("lr must be > 0", "/runs/c.toml")
    assert str(e.value) == "/runs/c.toml: lr must be > 0"

    class Special(LabError):
        pass

    with pytest.raises(Special, match="^no CUDA device$"), labconfig.flags_named(flags):
        raise Special("no CUDA device")
    with pytest.raises(LabError, match=r"^--val-fraction must be in \[0, 1\), and lr > 0$"), \
            labconfig.flags_named(flags):
        raise LabError("val_fraction must be in [0, 1), and lr > 0")


def test_only_whole_field_names_become_flags():
    """A name is not replaced inside a file name or a longer word; one without an underscore only where it
    begins the message (elsewhere it may be a word of the sentence)."""
    flags = {"device": "--device", "val_fraction": "--val-fraction"}
    assert labconfig._flags_for_fields("val_fraction.json is missing", flags) == "val_fraction.json is missing"
    assert labconfig._flags_for_fields("device must be cuda: no CUDA device", flags) == \
        "--device must be cuda: no CUDA device"
    assert labconfig._flags_for_fields("set val_fraction.", flags) == "set --val-fraction."


def test_cli_flags_names_the_commands_own_options_too():
    args = argparse.Namespace(cfg__lr="1", cfg__steps=None, val_fraction=0.2)
    assert labconfig.cli_flags(args, "val_fraction") == {"lr": "--lr", "val_fraction": "--val-fraction"}


def test_a_section_name_given_a_value_not_a_table_is_an_unknown_key(tmp_path):
    """`train = 3` where a [train] table may stand: one line naming the file, not a TypeError."""
    path = tmp_path / "c.toml"
    path.write_text("other = 3\n")
    with pytest.raises(LabError, match=rf"^{path}: unknown config key\(s\) other; known: steps$"):
        labconfig.load_toml(Other, path, section="other")
    path.write_text("[other]\nsteps = 4\n")
    assert labconfig.load_toml(Other, path, section="other") == Other(steps=4)
