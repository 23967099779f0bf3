"""noxfile: the host sessions install under the CPU image's lock, and `nox -s reproduce` installs the
library versions the run recorded. Loaded with a stand-in `nox` module, since the test venv has none
(nox runs the sessions from outside it)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import pytest

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"
ROOT = NOXFILE.parent
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
    spec = importlib.util.spec_from_file_location("noxfile_under_test", NOXFILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SESSIONS = sessions
    return module


def test_reproduce_pins_what_the_run_recorded(noxfile, tmp_path):
    run = tmp_path / "smoke"
    run.mkdir()
    packages = {"drafter_lab": "0.1.0", "torch": "2.13.0+cpu", "transformers": "5.24.0", "tokenizers": "0.23.3",
                "numpy": "2.4.6"}
    (run / "manifest.json").write_text(json.dumps({"packages": packages}))
    # The run directory is found among the session's arguments, wherever it stands.
    for args in ([str(run)], ["--cache", str(tmp_path / "c"), str(run)], [str(run), "--rel-tol", "0.01"]):
        assert noxfile.recorded_versions(args) == ["transformers==5.24.0", "tokenizers==0.23.3", "numpy==2.4.6"]


@pytest.mark.parametrize("manifest", [None, "{broken", "[1]", '{"packages": null}', '{"command": []}',
                                      '{"packages": {"transformers": null}}'])
def test_no_readable_record_pins_nothing(noxfile, tmp_path, manifest):
    run = tmp_path / "run"
    run.mkdir()
    if manifest is not None:
        (run / "manifest.json").write_text(manifest)
    assert noxfile.recorded_versions([str(run)]) == []
    assert noxfile.recorded_versions([]) == []


class FakeSession:
    def __init__(self, tmp):
        self.tmp, self.installs, self.runs = tmp, [], []
        self.virtualenv = types.SimpleNamespace(location=str(tmp))

    def create_tmp(self):
        return str(self.tmp)

    def install(self, *args):
        self.installs.append(args)

    def run(self, *args, **kwargs):
        self.runs.append(args)


@pytest.mark.parametrize("lock", ["CPU_LOCK", "GPU_LOCK"])
def test_lock_constraints_pin_every_locked_package_but_torch(noxfile, lock):
    text = Path(getattr(noxfile, lock)).read_text()
    locked = {line.split("==")[0]: line.split("==")[1].split()[0] for line in text.splitlines()
              if line and not line.startswith("#")}
    pins = noxfile.lock_constraints(text)
    assert "torch" in locked and "transformers" in locked
    assert sorted(pins) == sorted(f"{n}=={v}" for n, v in locked.items() if n != "torch")


def _installed_under(session, lock, noxfile):
    """Whether every install of `session` was held to `lock`'s versions."""
    constraints = str(session.tmp / "constraints.txt")
    return (all(call[:2] == ("-c", constraints) for call in session.installs)
            and Path(constraints).read_text().split() == noxfile.lock_constraints(Path(lock).read_text()))


@pytest.mark.parametrize("newest", [None, "1"])
def test_sessions_install_under_their_lock(noxfile, tmp_path, monkeypatch, newest):
    if newest is None:
        monkeypatch.delenv("DRAFTER_LAB_NEWEST", raising=False)
    else:
        monkeypatch.setenv("DRAFTER_LAB_NEWEST", newest)
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "nvcc").touch()
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    for session_fn, lock, torch_spec in ((noxfile.install_lab, noxfile.CPU_LOCK, noxfile.CPU_TORCH),
                                         (noxfile.build_cuda, noxfile.GPU_LOCK, noxfile.CUDA_TORCH)):
        (tmp_path / Path(lock).stem).mkdir()
        session = FakeSession(tmp_path / Path(lock).stem)
        session_fn(session)
        assert [a for call in session.installs for a in call if a.startswith("torch")] == [torch_spec]
        if newest:
            assert all("-c" not in call for call in session.installs)
        else:
            assert _installed_under(session, lock, noxfile)


def test_gpu_stack_session_tests_the_model_suites_under_the_gpu_images_transformers(noxfile, tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTER_LAB_NEWEST", raising=False)
    session = FakeSession(tmp_path)
    session.posargs = []
    noxfile.tests_gpu_stack(session)
    *lab, stack = session.installs
    assert [a for call in lab for a in call if a.startswith("torch")] == [noxfile.CPU_TORCH]
    gpu_constraints = tmp_path / "constraints-gpu.txt"
    assert stack[:2] == ("-c", str(gpu_constraints)) and "transformers" in stack[2:]
    pins = gpu_constraints.read_text().split()
    assert pins == noxfile.lock_constraints(Path(noxfile.GPU_LOCK).read_text())
    assert any(p.startswith("transformers==") for p in pins)  # what SGLang's image runs, not the CPU lock's
    assert (tmp_path / "constraints.txt").read_text().split() == noxfile.lock_constraints(
        Path(noxfile.CPU_LOCK).read_text())
    assert session.runs == [("pytest", "-q", "--timeout=900", *noxfile.MODEL_SUITES)]
    assert all((ROOT / suite).is_dir() for suite in noxfile.MODEL_SUITES)


def test_reproduce_without_a_run_directory_stops_before_installing(noxfile, tmp_path):
    """It installed torch and compiled the extension (minutes), then failed on argparse."""
    class Stop(Exception):
        pass

    session = FakeSession(tmp_path)
    session.posargs = []
    session.error = lambda message: (_ for _ in ()).throw(Stop(message))
    with pytest.raises(Stop, match="name a run directory"):
        noxfile.reproduce(session)
    assert session.installs == [] and session.runs == []


def test_build_cuda_checks_the_machine_code_torch_builds_for_each_arch_entry(noxfile):
    """"9.0+PTX" was looked for as sm_90+PTX and failed a good build; torch also takes spaces and "9.0a"."""
    assert noxfile.machine_code("8.0;9.0;12.0") == ["sm_80", "sm_90", "sm_120"]
    assert noxfile.machine_code(" 8.0 9.0a;12.0+PTX ") == ["sm_80", "sm_90a", "sm_120"]


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
