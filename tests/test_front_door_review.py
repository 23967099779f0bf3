"""The front door as a newcomer meets it: the README's command lines exist as written, the nox sessions it
and CI name exist, and what the host sessions install is held by the images' locks. The noxfile is loaded
with a stand-in `nox` module, as in test_noxfile.py."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture
def noxfile(monkeypatch):
    sessions = []

    def session(*args, **kwargs):
        def register(f):
            sessions.append(f.__name__)
            return f
        return register(args[0]) if args and callable(args[0]) else register

    monkeypatch.setitem(sys.modules, "nox", types.SimpleNamespace(session=session, options=types.SimpleNamespace()))
    spec = importlib.util.spec_from_file_location("noxfile_front_door", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SESSIONS = sessions
    return module


class FakeSession:
    def __init__(self, tmp):
        self.tmp, self.installs = tmp, []
        self.virtualenv = types.SimpleNamespace(location=str(tmp))

    def create_tmp(self):
        return str(self.tmp)

    def install(self, *args):
        self.installs.append(args)

    def run(self, *args, **kwargs):
        pass


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]).lower()


def test_sessions_install_nothing_their_lock_leaves_unpinned(noxfile, tmp_path, monkeypatch):
    # pybind11 was installed on top of the lock (torch ships its headers), so a release of it reached
    # every session's extension build. pip is the installer itself, upgraded in the fresh venv.
    monkeypatch.delenv("DRAFTER_LAB_NEWEST", raising=False)
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "nvcc").touch()
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    for session_fn, lock in ((noxfile.install_lab, noxfile.CPU_LOCK), (noxfile.build_cuda, noxfile.GPU_LOCK)):
        locked = {_name(p) for p in noxfile.lock_constraints(Path(lock).read_text())}
        (tmp_path / Path(lock).stem).mkdir()
        session = FakeSession(tmp_path / Path(lock).stem)
        session_fn(session)
        named = [a for call in session.installs for a in call
                 if not a.startswith("-") and not a.startswith(".") and not a.endswith("constraints.txt")]
        unpinned = [r for r in named if _name(r) not in locked | {"torch", "pip"}]
        assert not unpinned, f"{session_fn.__name__} installs {unpinned}, which {Path(lock).name} does not pin"


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


def test_nox_sessions_named_in_readme_and_ci_exist(noxfile):
    texts = {"README.md": README, ".ci/run": (ROOT / ".ci" / "run").read_text(),
             "containers/ci.sh": (ROOT / "containers" / "ci.sh").read_text(), "noxfile.py": noxfile.__doc__}
    named = {(where, s) for where, text in texts.items()
             for m in re.finditer(r"nox -s ((?:[a-z_]+ ?)+)", text) for s in m.group(1).split()}
    assert {s for _, s in named} >= {"experiment", "tests"}
    assert not [f"{where}: nox -s {s}" for where, s in sorted(named) if s not in noxfile.SESSIONS]
    # CI runs the README's test command.
    assert re.search(r"^python3 -m nox -s [a-z_ ]*\btests\b", texts[".ci/run"], re.M)


def test_front_door_says_how_to_get_the_cpu_torch(noxfile):
    # A torch pin without +cpu resolves on PyPI to the CUDA build: the README's first commands must say
    # how to get the CPU wheel before a newcomer downloads gigabytes the lock does not cover.
    front = README.split("\n## ", 1)[0]
    assert "+cpu" in noxfile.CPU_TORCH or ("PIP_EXTRA_INDEX_URL" in front and "whl/cpu" in front)
