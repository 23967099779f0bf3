"""Dataclass configs: a docstring under every field, loadable from TOML, overridable from the CLI.

Each area keeps its own config dataclass next to the code that uses it (targets.build.TargetConfig,
train.config.TrainConfig, ...). This module holds the shared machinery:

- `field_docs(cls)` reads the docstring written under each field, for `--help` and for reports;
- `from_dict` / `load_toml` build a config and reject unknown keys with the file's name;
- `add_cli_args` / `apply_cli_args` expose every field as `--field-name VALUE`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
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


def _coerce(value, tp, where: str):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        tp = next(a for a in args if a is not type(None))
        return _coerce(value, tp, where)
    if origin in (list, tuple):
        items = value.split(",") if isinstance(value, str) else list(value)
        inner = args[0] if args else str
        out = [_coerce(v, inner, where) for v in items if v != ""]
        return tuple(out) if origin is tuple else out
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if tp in (int, float, str):
            return tp(value)
        if tp is Path:
            return Path(value)
    except (TypeError, ValueError):
        raise LabError(f"{where}: cannot read {value!r} as {getattr(tp, '__name__', tp)}") from None
    return value


def from_dict(cls, data: dict, source: str = "config"):
    """Build `cls` from a mapping; unknown keys are an error naming `source`."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise LabError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}", source)
    kwargs = {k: _coerce(v, _field_type(cls, k), f"{source}: {k}") for k, v in data.items()}
    return cls(**kwargs)


def load_toml(cls, path, section: str | None = None):
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise LabError("config file not found", path) from None
    except tomllib.TOMLDecodeError as e:
        raise LabError(f"not valid TOML: {e}", path) from None
    if section is not None:
        data = data.get(section, {})
    return from_dict(cls, data, str(path))


def replace(cfg, **overrides):
    """dataclasses.replace with type coercion and a clear error for unknown names."""
    merged = {**dataclasses.asdict(cfg), **overrides}
    return from_dict(type(cfg), {k: v for k, v in merged.items()}, type(cfg).__name__)


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
    return replace(cfg, **overrides) if overrides else cfg
