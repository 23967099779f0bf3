"""containers/: the lock pip enforces, the engine choice, the apt mirror, the smoke list, the fat-binary
reader of the GPU check, and (with buildah) the image import used for the local base."""

from __future__ import annotations

import importlib.util
import io
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_build():
    spec = importlib.util.spec_from_file_location("containers_build", ROOT / "containers" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()


def _wheel(dest: Path, name: str, version: str, payload: bytes) -> Path:
    """A minimal but installable wheel (PEP 427: METADATA, WHEEL, RECORD)."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    path = dest / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{name}/__init__.py": payload,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, data in files.items():
            z.writestr(arc, data)
        z.writestr(f"{dist}/RECORD", "".join(f"{a},,\n" for a in files) + f"{dist}/RECORD,,\n")
    return path


def _pip_download(lock: Path, links: Path, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-index", "--find-links", str(links), "--require-hashes",
         "--no-deps", "--dest", str(dest), "-r", str(lock)],
        capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )


def test_lock_is_accepted_by_pip_and_rejects_a_changed_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    token = uuid.uuid4().hex.encode()
    files = [_wheel(wheels, "lab_dep_a", "1.0", b"A=" + token), _wheel(wheels, "lab_dep_b", "2.3.post1", b"B")]
    target = build.Target("3.11", "manylinux_2_36_x86_64")
    lock = tmp_path / "requirements.lock"
    build.write_lock(lock, "cpu", ["lab_dep_a", "lab_dep_b>=2"], target, files)

    key, entries = build.read_lock(lock)
    assert key == build.inputs_key(["lab_dep_a", "lab_dep_b>=2"], target)
    assert sorted(entries) == sorted((f.name, build.sha256_file(f)) for f in files)
    assert "lab-dep-b==2.3.post1 --hash=sha256:" in lock.read_text()

    got = _pip_download(lock, wheels, tmp_path / "ok")
    assert got.returncode == 0, got.stderr
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == sorted(f.name for f in files)

    _wheel(wheels, "lab_dep_a", "1.0", b"A=tampered")  # same name, other bytes
    bad = _pip_download(lock, wheels, tmp_path / "bad")
    assert bad.returncode != 0
    assert "hash" in bad.stderr.lower()


@pytest.mark.parametrize("flavor, session", [("cpu", "nox -s container"), ("gpu", "nox -s container -- gpu")])
def test_committed_locks_were_resolved_from_pyprojects_requirements(flavor, session):
    # The images install them and the host's nox sessions install under them: a requirement changed
    # without resolving the lock again would hold both to versions the project no longer asks for.
    lock = ROOT / "containers" / f"requirements-{flavor}.lock"
    recorded = [line.removeprefix("# input: ") for line in lock.read_text().splitlines() if line.startswith("# input: ")]
    assert recorded == build.lock_inputs(flavor), f"{lock.name} is stale: `{session}` resolves it again"


def test_inputs_key_follows_inputs_and_target():
    t311, t312 = build.Target("3.11", "manylinux_2_36_x86_64"), build.Target("3.12", "manylinux_2_39_x86_64")
    assert build.inputs_key(["a", "b"], t311) == build.inputs_key(["a", "b"], t311)
    assert build.inputs_key(["a", "b"], t311) != build.inputs_key(["a", "c"], t311)
    assert build.inputs_key(["a", "b"], t311) != build.inputs_key(["a", "b"], t312)


@pytest.mark.parametrize(
    ("filename", "requirement"),
    [
        ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch==2.13.0+cpu"),
        ("typing_extensions-4.16.0-py3-none-any.whl", "typing-extensions==4.16.0"),
        ("Jinja2-3.1.6-py3-none-any.whl", "jinja2==3.1.6"),
        ("pkg-1.0-1build-py3-none-any.whl", "pkg==1.0"),
    ],
)
def test_wheel_requirement(filename, requirement):
    assert build.wheel_requirement(filename) == requirement


def test_wheel_requirement_rejects_other_files():
    with pytest.raises(build.BuildError, match="not a wheel"):
        build.wheel_requirement("torch-2.13.0.tar.gz")


def test_platforms_cover_older_manylinux_tags():
    plats = build.Target("3.11", "manylinux_2_36_x86_64").platforms
    assert plats[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(plats)
    assert "manylinux_2_37_x86_64" not in plats


def test_apt_mirror_reads_deb822_and_one_line_sources(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert build.apt_mirror("bookworm", roots=(tmp_path / "sources.list", d)) == "http://mirror.invalid/debian"

    one = tmp_path / "one"
    one.mkdir()
    (one / "x.list").write_text("# deb http://nope.invalid bookworm main\ndeb [arch=amd64] http://one.invalid/d bookworm main contrib\n")
    assert build.apt_mirror("bookworm", roots=(one,)) == "http://one.invalid/d"
    with pytest.raises(build.BuildError, match="no Debian trixie archive"):
        build.apt_mirror("trixie", roots=(one,))


def test_smoke_tests_from_file_and_environment(tmp_path, monkeypatch):
    f = tmp_path / "smoke-tests.txt"
    f.write_text("# comment\ntests/experiments\n\ntests/data/test_x.py  # quick\n")
    monkeypatch.delenv(build.SMOKE_TESTS_ENV, raising=False)
    assert build.smoke_tests(f) == ["tests/experiments", "tests/data/test_x.py"]
    monkeypatch.setenv(build.SMOKE_TESTS_ENV, "tests/a tests/b")
    assert build.smoke_tests(f) == ["tests/a", "tests/b"]


def test_smoke_list_names_existing_tests():
    for entry in build.smoke_tests(build.SMOKE_TESTS_FILE):
        assert (ROOT / entry.split("::")[0]).exists(), entry


def _stub(dir_: Path, name: str, rc: int) -> None:
    p = dir_ / name
    p.write_text(f"#!/bin/sh\nexit {rc}\n")
    p.chmod(0o755)


def test_engine_detection_skips_a_docker_without_daemon(tmp_path):
    _stub(tmp_path, "docker", 1)  # `docker info` fails: no daemon
    _stub(tmp_path, "podman", 0)
    assert build.detect_engine(path=str(tmp_path)).name == "podman"
    _stub(tmp_path, "buildah", 0)
    assert build.detect_engine(path=str(tmp_path)).name == "buildah"
    _stub(tmp_path, "docker", 0)
    assert build.detect_engine(path=str(tmp_path)).name == "docker"
    assert build.detect_engine("podman", path=str(tmp_path)).name == "podman"
    assert build.detect_engine(path=str(tmp_path / "empty")) is None


@pytest.mark.skipif(shutil.which("buildah") is None or os.geteuid() != 0, reason="needs buildah, as root")
def test_buildah_imports_a_rootfs_with_its_label(tmp_path):
    tar = tmp_path / "rootfs.tar"
    content = uuid.uuid4().hex.encode()
    with tarfile.open(tar, "w") as t:
        info = tarfile.TarInfo("etc/marker")
        info.size = len(content)
        t.addfile(info, io.BytesIO(content))
    engine = build.Buildah(shutil.which("buildah"))
    ref = f"localhost/drafter-lab-test-import:{uuid.uuid4().hex[:8]}"
    try:
        engine.import_rootfs(tar, ref, {"drafter-lab.base-inputs": "k123"})
        assert engine.exists(ref)
        assert engine.label(ref, "drafter-lab.base-inputs") == "k123"
        assert engine.digest(ref).startswith("sha256:")
        ctr = subprocess.run(["buildah", "from", "--pull-never", ref], capture_output=True, text=True, check=True).stdout.strip()
        try:
            mnt = subprocess.run(["buildah", "mount", ctr], capture_output=True, text=True, check=True).stdout.strip()
            assert (Path(mnt) / "etc" / "marker").read_bytes() == content
        finally:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
    finally:
        subprocess.run(["buildah", "rmi", ref], capture_output=True)
    assert not engine.exists(ref)


def _load_fatbin_archs():
    spec = importlib.util.spec_from_file_location("fatbin_archs", ROOT / "containers" / "fatbin_archs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b""
    for kind, sm, payload in entries:
        header = bytearray(64)
        struct.pack_into("<HHII", header, 0, kind, 1, 64, len(payload))
        struct.pack_into("<I", header, 28, sm)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _elf_with_section(name: bytes, content: bytes) -> bytes:
    strtab = b"\0.shstrtab\0" + name + b"\0"
    data_off = 64
    strtab_off = data_off + len(content)
    shoff = strtab_off + len(strtab)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)
    sections = [
        struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, strtab_off, len(strtab), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, data_off, len(content), 0, 0, 8, 0),
    ]
    return header + content + strtab + b"".join(sections)


def test_fatbin_archs_counts_sass_and_ptx_per_sm(tmp_path, capsys):
    fa = _load_fatbin_archs()
    rng = random.Random(uuid.uuid4().int)
    payload = lambda: bytes(rng.randrange(256) for _ in range(8 * rng.randrange(1, 6)))  # noqa: E731
    first = _fatbin([(2, 80, payload()), (2, 90, payload()), (1, 90, payload())])
    second = _fatbin([(2, 80, payload()), (2, 120, payload())])
    lib = tmp_path / "lib.so"
    lib.write_bytes(_elf_with_section(b".nv_fatbin", first + bytes(8) + second))  # padding between

    assert fa.fatbin_entries(lib.read_bytes()) == {("sass", 80): 2, ("sass", 90): 1, ("ptx", 90): 1, ("sass", 120): 1}
    assert fa.main([str(lib), "--expect", "80,90,120"]) == 0
    assert "sass sm_120: 1" in capsys.readouterr().out
    assert fa.main([str(lib), "--expect", "80,100"]) == 1
    assert "sm_100" in capsys.readouterr().err

    other = tmp_path / "other.so"
    other.write_bytes(_elf_with_section(b".text", first))
    assert fa.fatbin_entries(other.read_bytes()) == {}
    with pytest.raises(ValueError, match="ELF64"):
        fa.fatbin_entries(b"MZ" + bytes(100))
