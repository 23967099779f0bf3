"""TOML values must have their field's type; strings are read as the type only from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from drafter_lab.config import load_toml, replace
from drafter_lab.errors import LabError


@dataclass
class Cfg:
    steps: int = 1
    """Steps."""
    lr: float = 0.1
    """Rate."""
    flag: bool = False
    """Switch."""
    name: str = ""
    """Name."""
    out: Path = Path(".")
    """Where."""
    levels: list[float] = field(default_factory=list)
    """Levels."""
    limit: int | None = None
    """Cap."""


@pytest.mark.parametrize("text", [
    "steps = 3.7", "steps = true", 'steps = "8"', "steps = inf", "flag = 2", "flag = 0", "flag = []",
    'flag = "false"', "name = 5", "name = [1, 2]", "name = 1979-05-27", "lr = true", 'lr = "1e-3"',
    'levels = "0,1"', "levels = [true]", "limit = 2.5",
])
def test_a_toml_value_of_another_type_is_refused_naming_file_and_key(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(LabError, match=f"^{path}: {text.split()[0]}: cannot read"):
        load_toml(Cfg, path)


def test_toml_values_of_their_type_load_and_cli_strings_are_read(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('steps = 3\nlr = 1\nflag = true\nname = "x"\nout = "o"\nlevels = [0, 0.5]\nlimit = 4\n')
    cfg = load_toml(Cfg, path)
    assert cfg == Cfg(3, 1.0, True, "x", Path("o"), [0.0, 0.5], 4) and isinstance(cfg.lr, float)
    cli = replace(cfg, steps="5", lr="1e-3", flag="no", levels="1,2", limit="none")
    assert cli == Cfg(5, 1e-3, False, "x", Path("o"), [1.0, 2.0], None)
    with pytest.raises(LabError, match="^Cfg: steps: cannot read '2.5' as int"):
        replace(cfg, steps="2.5")


@pytest.mark.parametrize("text", ["1,,2", "1,", ",1"])
def test_a_cli_list_with_an_empty_item_is_refused(text):
    """A value lost to a typo was dropped without a word ("1,,2" read as [1, 2])."""
    with pytest.raises(LabError, match=f"^Cfg: levels: an empty item in '{text}'$"):
        replace(Cfg(), levels=text)
    assert replace(Cfg(levels=[1.0]), levels="").levels == []  # the empty list, for the config to judge


def test_an_unreadable_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(LabError, match=f"^{tmp_path / 'bin.toml'}: not valid TOML: not UTF-8 text$"):
        load_toml(Cfg, tmp_path / "bin.toml")
    with pytest.raises(LabError, match=f"^{tmp_path}: cannot read the config file: Is a directory$"):
        load_toml(Cfg, tmp_path)


def test_fields_beside_the_section_table_are_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("steps = 3\nname = 'x'\n[cfg]\nlr = 0.5\n")
    with pytest.raises(LabError, match=f"^{path}: key\\(s\\) name, steps outside the \\[cfg\\] table"):
        load_toml(Cfg, path, section="cfg")
    path.write_text("[cfg]\nlr = 0.5\n")
    assert load_toml(Cfg, path, section="cfg").lr == 0.5
    path.write_text("lr = 0.5\n")
    assert load_toml(Cfg, path, section="cfg").lr == 0.5
