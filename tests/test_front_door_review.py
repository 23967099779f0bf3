"""The front door as a newcomer meets it: the README's command lines exist as written (the nox sessions it
names are checked in test_noxfile.py)."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _parsers() -> dict[tuple[str, ...], set[str]]:
    """Each `drafter-lab` command path -> its long options; the benchmarks' own parsers included."""
    import torch  # noqa: F401  (before the extension)

    from drafter_lab.cli import build_parser
    from drafter_lab.kernels.commands import BENCHES

    out: dict[tuple[str, ...], set[str]] = {}

    def walk(parser, path):
        out[path] = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(), ())

    class Parsed(Exception):
        pass

    def grab(self, *args, **kwargs):
        raise Parsed(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", grab)
        for name, module in BENCHES.items():
            with pytest.raises(Parsed) as got:
                importlib.import_module(module).main([])
            out[("bench", name)] = {o for a in got.value.args[0]._actions for o in a.option_strings
                                    if o.startswith("--")}
    return out


def _command_lines() -> list[str]:
    """Every inline code span and code-block line of the README, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", README)
    lines = re.findall(r"`([^`\n]+)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines += block.splitlines()
    return lines


def test_every_readme_command_and_flag_exists():
    parsers = _parsers()
    commands = sorted({p[0] for p in parsers if p}, key=len, reverse=True)
    # `drafter-lab CMD ...`, `$IMG CMD ...` (the image's entrypoint), or a span that starts with a command.
    at = re.compile(r"(?:^|drafter-lab |\$IMG )(" + "|".join(map(re.escape, commands)) + r")\b(.*)")
    wrong, seen = [], 0
    for line in _command_lines():
        for m in at.finditer(line):
            rest = re.split(r"\s(?:drafter-lab|nox|docker|vllm|python|#|\|)\s", m.group(2))[0]
            words = rest.split()
            path = (m.group(1), words[0]) if words and (m.group(1), words[0]) in parsers else (m.group(1),)
            if path not in parsers:
                wrong.append(f"`{' '.join(path)}`: no such command (in `{line}`)")
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                seen += 1
                if flag not in parsers.get(path, set()) | {"--help"}:
                    wrong.append(f"`{' '.join(path)} {flag}`: no such option (in `{line[:100]}`)")
        if "drafter-lab " in line:
            for word in re.findall(r"drafter-lab ([a-z][a-z-]*)", line):
                if (word,) not in parsers:
                    wrong.append(f"`drafter-lab {word}`: no such command (in `{line[:100]}`)")
    assert seen > 100, "the README's command lines were not found"
    assert not wrong, "\n".join(wrong)
