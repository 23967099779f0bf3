"""Mutation review s77 (h2) of drafter_lab/config.py: field docs for --help (a plain base class's
annotations, a class without source), a TOML value that is no list, a list without an item type, a dict
field taken as given, and flags listed in a message."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError


class Mixin:
    tag: str = "m"
    """A plain class's annotation, not a field of any config."""


@dataclass
class Mixed(Mixin):
    steps: int = 1
    """Steps."""


def test_field_docs_skip_a_base_class_that_is_no_dataclass():
    assert labconfig.field_docs(Mixed) == {"steps": "Steps."}


def test_a_dataclass_without_source_has_no_docs_and_no_error():
    """make_dataclass's class has no source to read: --help shows its fields undocumented."""
    built = dataclasses.make_dataclass("Built", [("steps", int, dataclasses.field(default=1))])
    assert labconfig.field_docs(built) == {}


@dataclass
class Lists:
    levels: list[float] = dataclasses.field(default_factory=list)
    """Levels."""
    names: typing.List = dataclasses.field(default_factory=list)  # noqa: UP006 (a bare list is no list to typing)
    """A list without an item type: strings."""


@pytest.mark.parametrize("text, shown", [('levels = "0,1"', "'0,1'"), ("levels = 5", "5"), ("levels = {a = 1}", "{'a': 1}")])
def test_a_toml_value_that_is_no_list_is_refused_as_a_whole(tmp_path, text, shown):
    """A string was read character by character, and a number was a TypeError's traceback."""
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(LabError) as e:
        labconfig.load_toml(Lists, path)
    assert str(e.value) == f"{path}: levels: cannot read {shown} as a list"


def test_a_list_without_an_item_type_reads_strings():
    assert labconfig.replace(Lists(), names="a,b").names == ["a", "b"]
    with pytest.raises(LabError, match=r"^Lists: names: cannot read 1 as str$"):
        labconfig.from_dict(Lists, {"names": ["a", 1]}, "Lists")


@dataclass
class Kwargs:
    extra: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments, taken as the file gives them."""


def test_a_table_for_a_dict_field_is_taken_as_given(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[extra]\nenable_thinking = false\nname = "x"\n')
    assert labconfig.load_toml(Kwargs, path).extra == {"enable_thinking": False, "name": "x"}


@pytest.mark.parametrize("flags, said", [(["--a"], "--a"), (["--a", "--b"], "--a and --b"),
                                         (["--a", "--b", "--c"], "--a, --b and --c")])
def test_flags_are_listed_as_a_sentence_lists_them(flags, said):
    assert labconfig.listed(flags) == said
