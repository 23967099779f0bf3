"""Dataclass configs: a docstring under every field, loadable from TOML, overridable from the CLI.

Each area keeps its own config dataclass next to the code that uses it (targets.build.TargetConfig,
train.config.TrainConfig, ...). This module holds the shared machinery:

- `field_docs(cls)` reads the docstring written under each field, for `--help` and for reports;
- `from_dict` / `load_toml` build a config and reject unknown keys and values of another type with the file's name;
- `add_cli_args` / `apply_cli_args` expose every field as `--field-name VALUE`;
- `flags_named` has the checks' complaints about a field the command line set name its flag.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import math
import re
import textwrap
import tomllib
import typing
from pathlib import Path

from drafter_lab.errors import LabError


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """Map each field of dataclass `cls` to the string literal written right under it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _field_type(cls, name: str):
    return typing.get_type_hints(cls)[name]


# What a value given already typed (TOML, JSON, code) may be for each field type: never a bool for a number.
_ACCEPTED = {bool: (bool,), int: (int,), float: (int, float), str: (str,), Path: (str, Path)}


def _coerce(value, tp, where: str, parse: bool):
    """`value` as type `tp`. `parse`: strings come from the command line and are read as the type;
    anything else must already be of the type, so `batch_size = 3.7` is refused, not cut to 3."""
    # A bare `list` or `tuple` has no origin to typing: read as typing.List's, items of str.
    origin = typing.get_origin(tp) or tp
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        tp = next(a for a in args if a is not type(None))
        return _coerce(value, tp, where, parse)
    if origin in (list, tuple):
        if parse and isinstance(value, str):
            items = value.split(",") if value else []  # "" is the empty list, which the config judges
            if "" in items:  # "1,,2" or "1,": a value lost to a typo
                raise LabError(f"{where}: an empty item in {value!r}")
            value = items
        if not isinstance(value, (list, tuple)):
            raise LabError(f"{where}: cannot read {value!r} as a list")
        inner = args[0] if args else str
        out = [_coerce(v, inner, where, parse) for v in value]
        return tuple(out) if origin is tuple else out
    if tp not in _ACCEPTED:
        return value  # dicts and other types are taken as given
    if parse and isinstance(value, str):
        value = _parse(value, tp)
    if isinstance(value, _ACCEPTED[tp]) and (tp is bool or not isinstance(value, bool)):
        try:
            return tp(value)
        except OverflowError:  # an int of 309 digits or more for a float
            pass
    raise LabError(f"{where}: cannot read {value!r} as {tp.__name__}")


def _parse(text: str, tp):
    """A command-line string read as `tp`; the string itself where it does not read as one."""
    if tp is bool:
        return {"1": True, "true": True, "yes": True, "on": True,
                "0": False, "false": False, "no": False, "off": False}.get(text.lower(), text)
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            return text
    return text


def from_dict(cls, data: dict, source: str = "config", parse: bool = False):
    """Build `cls` from a mapping; unknown keys are an error naming `source`. `parse`: string values
    come from the command line and are read as their fields' types (see `_coerce`)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise LabError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}", source)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:  # cls() would raise a TypeError
        raise LabError(f"missing config key(s) {', '.join(missing)}", source)
    kwargs = {k: _coerce(v, _field_type(cls, k), f"{source}: {k}", parse) for k, v in data.items()}
    return cls(**kwargs)


def load_toml(cls, path, section: str | None = None):
    """Build `cls` from a TOML file: its fields at top level or, when the file has a `section` table,
    in that table, with nothing else at top level (a key beside the table would be silently ignored)."""
    if str(path) == "":  # an unset $CFG in a script: Path("") is the current directory
        raise LabError("an empty path names no config file")
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # -sig: a BOM, as some editors save
    except FileNotFoundError:
        raise LabError("config file not found", path) from None
    except UnicodeDecodeError:
        raise LabError("not valid TOML: not UTF-8 text", path) from None
    except OSError as e:
        raise LabError(f"cannot read the config file: {e.strerror}", path) from None
    except ValueError as e:  # a TOMLDecodeError, or an integer past Python's 4300 digits
        raise LabError(f"not valid TOML: {e}", path) from None
    if section is not None and isinstance(data.get(section), dict):
        others = sorted(set(data) - {section})
        if others:
            raise LabError(f"key(s) {', '.join(others)} outside the [{section}] table would be ignored; "
                           f"put every field in [{section}] or all at top level", path)
        data = data[section]
    try:
        return from_dict(cls, data, str(path))
    except LabError as e:  # a value refused by the config's own checks, which name the key but not the file
        if e.path is not None or str(e).startswith(f"{path}: "):
            raise
        raise LabError(str(e), path) from None


def check_counts(cfg, at_least_one: tuple[str, ...], at_least_zero: tuple[str, ...]) -> None:
    """Fields that would make a run do nothing or fail late (counts below one; numbers below zero, NaN or
    infinite), refused in one line before anything runs."""
    for name in at_least_one:
        if getattr(cfg, name) < 1:
            raise LabError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in at_least_zero:
        if not 0 <= getattr(cfg, name) < math.inf:  # nan and inf too
            raise LabError(f"{name} must be >= 0 and finite, got {getattr(cfg, name)}")


def check_seed(seed: int, name: str = "seed") -> None:
    """A seed torch's generators take (64 bits): a larger one was a ValueError traceback where the first
    generator was seeded, after the model loaded."""
    if not -(2**63) <= seed < 2**64:
        raise LabError(f"{name} must be in -2**63..2**64-1 (torch's 64-bit seeds), got {seed}")


def replace(cfg, **overrides):
    """dataclasses.replace with strings (the command line's) read as their fields' types, and a clear error
    for unknown names."""
    merged = {**dataclasses.asdict(cfg), **overrides}
    return from_dict(type(cfg), {k: v for k, v in merged.items()}, type(cfg).__name__, parse=True)


def to_dict(cfg) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}


def add_cli_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """Add `--field-name VALUE` for each field of `cls`; unset options leave the config alone."""
    group = parser.add_argument_group(f"{cls.__name__} fields (override the config)")
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        group.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f"cfg__{f.name}",
            default=None,
            metavar=f.name.upper(),
            help=docs.get(f.name, "").replace("%", "%%"),  # argparse formats help with %
        )


def apply_cli_args(cfg, args: argparse.Namespace):
    """`cfg` with the `--field-name` options given for its own fields (a parser may hold several configs)."""
    names = {f.name for f in dataclasses.fields(cfg)}
    overrides = {
        k[len("cfg__"):]: v for k, v in vars(args).items()
        if k.startswith("cfg__") and v is not None and k[len("cfg__"):] in names
    }
    # Read here, so that a value that does not read names the flag typed, not the class and field; and the
    # class's own checks (__post_init__) name the flags given too.
    typed = {k: _coerce(v, _field_type(type(cfg), k), _flag(k), True) for k, v in overrides.items()}
    with flags_named({k: _flag(k) for k in typed}):
        return replace(cfg, **typed) if typed else cfg


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def listed(flags: list[str]) -> str:
    """Flags named in a message: `--a`, `--a and --b`, `--a, --b and --c`."""
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"


def cli_flags(args: argparse.Namespace, *fields: str) -> dict[str, str]:
    """Each config field the command line set -> its flag: the `--field-name` options given, and `fields`,
    the command's own options that set a field of that name (`train --val-fraction`)."""
    given = [k[len("cfg__"):] for k, v in vars(args).items() if k.startswith("cfg__") and v is not None]
    return {name: _flag(name) for name in (*given, *fields)}


@contextlib.contextmanager
def flags_named(flags: dict[str, str]):
    """Within: a LabError from the config checks, which name fields as a --config file spells them, names
    each field of `flags` (`cli_flags`) as the flag the user typed: `--val-fraction must be in [0, 1)`, not
    `val_fraction ...`. One naming a file (the --config's own value) is left as it is."""
    try:
        yield
    except LabError as e:
        if not flags or (e.path is not None and e.path not in flags):
            raise
        body = str(e)[len(e.path) + 2:] if e.path is not None else str(e)
        named = _flags_for_fields(body, flags)
        if named == body and e.path is None:
            raise
        raise LabError(named, flags.get(e.path)) from None


def _flags_for_fields(text: str, flags: dict[str, str]) -> str:
    """`text` with the fields of `flags` it names as their flags: a name with an underscore as a whole word
    (not inside a quoted value, a path or a longer name, a metric like loss_0); one without (lr, device)
    only where it begins the text, as elsewhere it may be a word of the sentence ("no CUDA device")."""
    def alternatives(names) -> str:
        return "(" + "|".join(map(re.escape, names)) + r")(?![\w'\"/-]|\.\w)"

    text = re.sub("^" + alternatives(flags), lambda m: flags[m[1]], text)
    joined = [name for name in flags if "_" in name]
    return re.sub(r"(?<![\w'\"/.-])" + alternatives(joined), lambda m: flags[m[1]], text) if joined else text
