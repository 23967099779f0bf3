"""noxfile: the host sessions install under the CPU image's lock, and `nox -s reproduce` installs the
library versions the run recorded. Loaded with a stand-in `nox` module, since the test venv has none
(nox runs the sessions from outside it)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"


@pytest.fixture
def noxfile(monkeypatch):
    def session(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)

    monkeypatch.setitem(sys.modules, "nox", types.SimpleNamespace(session=session, options=types.SimpleNamespace()))
    spec = importlib.util.spec_from_file_location("noxfile_under_test", NOXFILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
