#!/usr/bin/env python3
"""Builds drafter_lab's container images without a package index, and runs the lab inside them.

    python3 containers/build.py          CPU image  localhost/drafter-lab-cpu:<git sha> (and :latest)
    python3 containers/build.py smoke    inside the CPU image: fast tests, the smallest experiment,
                                         its manifest, and `reproduce` of it from an empty cache
    python3 containers/build.py gpu      the GPU recipe (Containerfile); on a machine without an image
                                         registry it runs on the local Debian base with the host's CUDA

`nox -s container [-- smoke|gpu]` calls this file. The engine is docker (when its daemon answers),
else buildah, else podman. With no image registry, a Debian bookworm base is made by debootstrap and
imported as localhost/drafter-lab-base:bookworm. Python packages come from a wheelhouse built here on
the host (`pip download`, pip's own configuration decides where from) and pinned with hashes in
containers/requirements-<flavor>.lock; the image build installs them with --no-index --require-hashes.
Base, wheelhouse and lock are reused while their inputs are unchanged. Runs on the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "containers"
CACHE = ROOT / ".cache" / "containers"
WHEELS = CACHE / "wheels"

BASE_IMAGE = "localhost/drafter-lab-base:bookworm"
BASE_SUITE = "bookworm"
# Everything the recipes need from Debian, so that building on the local base needs no network.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "g++")
# Upper glibc of Debian bookworm (2.36); pip also accepts every older manylinux tag under it.
BOOKWORM_PLATFORM = "manylinux_2_36_x86_64"
# Ubuntu 24.04, the default GPU base: Python 3.12, glibc 2.39.
UBUNTU_2404_PLATFORM = "manylinux_2_39_x86_64"
GPU_BASE = "nvidia/cuda:13.0.0-devel-ubuntu24.04"
PULL_PROBE_S = 20  # seconds for a registry to answer a pull before it counts as absent
CUDA_ARCHS = "8.0;9.0;10.0;12.0"
BUILD_TOOLS = ("setuptools>=68", "wheel", "ninja")
# What goes into the image's copy of the project (the rest of the checkout is not needed there).
SOURCE_PATHS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "csrc", "drafter_lab", "tests")
SMOKE_TESTS_FILE = HERE / "smoke-tests.txt"
SMOKE_TESTS_ENV = "DRAFTER_LAB_SMOKE_TESTS"


class BuildError(Exception):
    """A one-line reason the build cannot go on; printed as `error: ...`, exit 2."""


# ---------------------------------------------------------------------------------------------
# small helpers


def run(cmd: list[str], *, capture: bool = False, check: bool = True, **kw) -> subprocess.CompletedProcess:
    if not capture:
        print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, text=True, capture_output=capture, **kw)
    if check and proc.returncode != 0:
        detail = (proc.stderr or "").strip().splitlines()[-1:] if capture else []
        raise BuildError(f"`{' '.join(cmd[:3])} ...` exited {proc.returncode}{': ' + detail[0] if detail else ''}")
    return proc


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Timer:
    """Stage timings, printed as they end and as a table at exit."""

    def __init__(self):
        self.stages: list[tuple[str, float]] = []

    @contextmanager
    def stage(self, name: str):
        print(f"==> {name}", flush=True)
        t0 = time.monotonic()
        try:
            yield
        finally:
            dt = time.monotonic() - t0
            self.stages.append((name, dt))
            print(f"<== {name}: {dt:.1f} s", flush=True)

    def summary(self) -> str:
        width = max((len(n) for n, _ in self.stages), default=5)
        lines = [f"  {n:<{width}}  {dt:8.1f} s" for n, dt in self.stages]
        lines.append(f"  {'total':<{width}}  {sum(dt for _, dt in self.stages):8.1f} s")
        return "stage times:\n" + "\n".join(lines)


def git_tag() -> tuple[str, bool]:
    """Sha of HEAD, and whether the tree (untracked files included: they go in) differs."""
    try:
        sha = run(["git", "rev-parse", "HEAD"], capture=True, cwd=ROOT).stdout.strip()
        dirty = run(["git", "status", "--porcelain"], capture=True, cwd=ROOT).stdout.strip() != ""
    except (BuildError, OSError):
        return "nogit", True
    return sha, dirty


def image_tag() -> str:
    sha, dirty = git_tag()
    return f"{sha[:12]}-dirty" if dirty else sha[:12]


# ---------------------------------------------------------------------------------------------
# engines


class Engine:
    name = ""

    def __init__(self, exe: str):
        self.exe = exe

    def _ok(self, *args: str) -> bool:
        return run([self.exe, *args], capture=True, check=False).returncode == 0

    def pull(self, ref: str) -> bool:
        """Pull `ref`; False when no registry answers within PULL_PROBE_S (a DNS failure here can take
        most of a minute). Once the registry answers, the pull may take as long as it needs."""
        answered = ("Getting image source signatures", "Copying blob", "Pulling from", "Pulling fs layer")
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen([self.exe, "pull", ref], stdout=log, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + PULL_PROBE_S
            while proc.poll() is None:
                log.seek(0)
                if any(m in log.read() for m in answered):
                    return proc.wait() == 0
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    return False
                time.sleep(0.5)
            return proc.returncode == 0


class Docker(Engine):
    name = "docker"

    def exists(self, ref):
        return self._ok("image", "inspect", ref)

    def label(self, ref, key):
        p = run([self.exe, "image", "inspect", "-f", "{{json .Config.Labels}}", ref], capture=True, check=False)
        return (json.loads(p.stdout or "null") or {}).get(key) if p.returncode == 0 else None

    def digest(self, ref):
        return run([self.exe, "image", "inspect", "-f", "{{.Id}}", ref], capture=True).stdout.strip()

    def import_rootfs(self, tar, ref, labels):
        changes = [a for k, v in labels.items() for a in ("--change", f"LABEL {k}={v}")]
        run([self.exe, "import", *changes, "--change", 'CMD ["/bin/bash"]', str(tar), ref])

    def build(self, containerfile, context, tags, build_args, volumes, local_base, no_cache):
        if volumes:
            raise BuildError("docker build cannot bind-mount the host's CUDA; use buildah or podman, or a CUDA base")
        args = [a for t in tags for a in ("-t", t)] + [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        run([self.exe, "build", "-f", str(containerfile), *args, *(["--no-cache"] if no_cache else []), str(context)],
            env={**os.environ, "DOCKER_BUILDKIT": "1"})

    def run_in(self, ref, cmd, env, volumes):
        args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")] + [a for h, c in volumes.items() for a in ("-v", f"{h}:{c}")]
        return run([self.exe, "run", "--rm", "--entrypoint", cmd[0], *args, ref, *cmd[1:]], check=False).returncode


class Buildah(Engine):
    """buildah with chroot isolation: works where `podman run` cannot set up cgroups or rlimits."""

    name = "buildah"

    def exists(self, ref):
        return self._ok("inspect", "--type", "image", ref)

    def _inspect(self, ref) -> dict | None:
        p = run([self.exe, "inspect", "--type", "image", ref], capture=True, check=False)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def label(self, ref, key):
        info = self._inspect(ref)
        return ((info or {}).get("OCIv1", {}).get("config", {}).get("Labels") or {}).get(key)

    def digest(self, ref):
        info = self._inspect(ref)
        if info is None:
            raise BuildError(f"no image {ref}")
        return info["FromImageDigest"]

    def import_rootfs(self, tar, ref, labels):
        ctr = run([self.exe, "from", "scratch"], capture=True).stdout.strip()
        try:
            run([self.exe, "add", ctr, str(tar), "/"])
            lab = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
            run([self.exe, "config", *lab, "--cmd", "/bin/bash", ctr])
            run([self.exe, "commit", "--quiet", ctr, ref])
        finally:
            run([self.exe, "rm", ctr], capture=True, check=False)

    def build(self, containerfile, context, tags, build_args, volumes, local_base, no_cache):
        args = [a for t in tags for a in ("-t", t)] + [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        args += [a for h, c in volumes.items() for a in ("--volume", f"{h}:{c}")]
        pull = "--pull=never" if local_base else "--pull=false"
        run([self.exe, "bud", "--isolation=chroot", "--network=host", "--layers", "--force-rm", pull, *args,
             *(["--no-cache"] if no_cache else []), "-f", str(containerfile), str(context)])

    def run_in(self, ref, cmd, env, volumes):
        ctr = run([self.exe, "from", "--pull-never", "--quiet", ref], capture=True).stdout.strip()
        try:
            args = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
            args += [a for h, c in volumes.items() for a in ("--volume", f"{h}:{c}")]
            return run([self.exe, "run", "--isolation=chroot", *args, ctr, "--", *cmd], check=False).returncode
        finally:
            run([self.exe, "rm", ctr], capture=True, check=False)


class Podman(Buildah):
    """podman build shares buildah's flags; import and run are podman's own."""

    name = "podman"

    def exists(self, ref):
        return self._ok("image", "exists", ref)

    def label(self, ref, key):
        p = run([self.exe, "image", "inspect", "--format", "{{json .Labels}}", ref], capture=True, check=False)
        return (json.loads(p.stdout or "null") or {}).get(key) if p.returncode == 0 else None

    def digest(self, ref):
        return run([self.exe, "image", "inspect", "--format", "{{.Digest}}", ref], capture=True).stdout.strip()

    def import_rootfs(self, tar, ref, labels):
        changes = [a for k, v in labels.items() for a in ("--change", f"LABEL={k}={v}")]
        run([self.exe, "import", "--quiet", *changes, "--change", "CMD=/bin/bash", str(tar), ref])

    def build(self, containerfile, context, tags, build_args, volumes, local_base, no_cache):
        args = [a for t in tags for a in ("-t", t)] + [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        args += [a for h, c in volumes.items() for a in ("--volume", f"{h}:{c}")]
        pull = "--pull=never" if local_base else "--pull=missing"
        run([self.exe, "build", "--isolation=chroot", "--network=host", "--layers", "--force-rm", pull, *args,
             *(["--no-cache"] if no_cache else []), "-f", str(containerfile), str(context)])

    def run_in(self, ref, cmd, env, volumes):
        args = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        args += [a for h, c in volumes.items() for a in ("--volume", f"{h}:{c}")]
        return run([self.exe, "run", "--rm", "--entrypoint", cmd[0], *args, ref, *cmd[1:]], check=False).returncode


ENGINES = {"docker": Docker, "buildah": Buildah, "podman": Podman}


def detect_engine(prefer: str | None = None, *, path: str | None = None) -> Engine | None:
    """docker only when its daemon answers; then buildah; then podman. None when none is usable."""
    order = [prefer] if prefer else ["docker", "buildah", "podman"]
    for name in order:
        exe = shutil.which(name, path=path)
        if exe is None:
            continue
        if name == "docker":
            try:
                probe = subprocess.run([exe, "info"], capture_output=True, timeout=30, check=False)
            except subprocess.TimeoutExpired:  # a daemon that never answers (a stuck socket, a remote context)
                continue
            if probe.returncode != 0:
                continue
        return ENGINES[name](exe)
    return None


def install_tools() -> None:
    """Debian's buildah, podman and debootstrap (only with --install-tools or under CI=true)."""
    if shutil.which("apt-get") is None:
        raise BuildError("no container engine, and no apt-get to install one: install buildah or podman")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "buildah", "podman", "debootstrap"], env=env)


# ---------------------------------------------------------------------------------------------
# the local base


def apt_mirror(suite: str = BASE_SUITE, roots=(Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))) -> str:
    """The host's configured Debian archive for `suite` (deb822 or one-line sources)."""
    files: list[Path] = []
    for r in roots:
        files += sorted(r.glob("*.sources")) + sorted(r.glob("*.list")) if r.is_dir() else ([r] if r.is_file() else [])
    for f in files:
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, flags=re.M))
                if ("deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split()
                        and "main" in fields.get("Components", "").split() and fields.get("Enabled", "yes") != "no"):
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)$", line)
                if m and m.group(2) == suite and "main" in m.group(3).split():
                    return m.group(1)
    raise BuildError(f"no Debian {suite} archive in the host's apt sources; set DRAFTER_LAB_APT_MIRROR")


def ensure_base(engine: Engine, timer: Timer, rebuild: bool) -> None:
    """Debian bookworm by debootstrap, imported as BASE_IMAGE; skipped while its inputs are unchanged."""
    mirror = os.environ.get("DRAFTER_LAB_APT_MIRROR") or apt_mirror()
    key = hashlib.sha256(json.dumps([BASE_SUITE, "minbase", BASE_PACKAGES, mirror]).encode()).hexdigest()[:16]
    if not rebuild and engine.exists(BASE_IMAGE) and engine.label(BASE_IMAGE, "drafter-lab.base-inputs") == key:
        print(f"base {BASE_IMAGE} is up to date (inputs {key})")
        return
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing (apt-get install debootstrap, or run with --install-tools)")
    work = Path(tempfile.mkdtemp(prefix="drafter-lab-base-", dir="/var/tmp"))
    try:
        rootfs, tar = work / "rootfs", work / "rootfs.tar"
        with timer.stage("base: debootstrap"):
            run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE,
                 str(rootfs), mirror])
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
        with timer.stage("base: import"):
            run(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*",
                 "--exclude=./sys/*", "-cf", str(tar), "."])
            engine.import_rootfs(tar, BASE_IMAGE, {"drafter-lab.base-inputs": key})
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# wheelhouse and lock


@dataclass(frozen=True)
class Target:
    """Which wheels fit an image: its Python and its glibc."""

    python: str  # "3.11"
    platform: str  # the newest manylinux tag the image's glibc accepts

    @property
    def platforms(self) -> list[str]:
        """Every manylinux tag up to `platform`: older pips do not expand the list themselves."""
        m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", self.platform)
        if not m:
            return [self.platform]
        glibc, arch = int(m.group(1)), m.group(2)
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags = [f"manylinux_2_{v}_{arch}" for v in range(glibc, 4, -1)]
        return tags + [f"{legacy[v]}_{arch}" for v in sorted(legacy, reverse=True) if v <= glibc]

    @property
    def pip_args(self) -> list[str]:
        plats = [a for p in self.platforms for a in ("--platform", p)]
        return ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python, *plats]


def lab_requirements() -> list[str]:
    """The project's dependencies and its test extra, read from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get("test", [])]


FLAVORS = {
    # torch 2.13.0's CPU build (local version +cpu): a bare `torch` would pull a multi-GB CUDA build.
    "cpu": ["torch==2.13.0+cpu"],
    # sglang 0.5.23 requires exactly torch 2.14.1; on Linux that wheel is the CUDA 13.0 build.
    "gpu": ["torch==2.14.1", "sglang==0.5.23"],
}


def lock_inputs(flavor: str) -> list[str]:
    return [*FLAVORS[flavor], *lab_requirements(), *BUILD_TOOLS]


def lock_path(flavor: str, target: Target) -> Path:
    suffix = "" if target.python == "3.11" else f"-py{target.python.replace('.', '')}"
    return HERE / f"requirements-{flavor}{suffix}.lock"


WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def wheel_requirement(filename: str) -> str:
    """`name==version` for a wheel file name (PEP 427; names normalized as PEP 503 does)."""
    m = WHEEL_RE.match(filename)
    if not m:
        raise BuildError(f"{filename}: not a wheel file name")
    name = re.sub(r"[-_.]+", "-", m.group("name")).lower()
    return f"{name}=={m.group('version')}"


def inputs_key(inputs: list[str], target: Target) -> str:
    return hashlib.sha256(json.dumps([inputs, target.python, target.platform]).encode()).hexdigest()


def write_lock(path: Path, flavor: str, inputs: list[str], target: Target, wheels: list[Path]) -> None:
    """One `name==version --hash=sha256:...  # file` line per wheel; header names the inputs."""
    lines = [
        f"# drafter-lab {flavor} image: CPython {target.python}, {target.platform}.",
        "# Generated by containers/build.py from the wheelhouse it resolved; regenerated when the inputs change.",
        *(f"# input: {r}" for r in inputs),
        f"# inputs-sha256: {inputs_key(inputs, target)}",
    ]
    for w in sorted(wheels, key=lambda p: p.name.lower()):
        lines.append(f"{wheel_requirement(w.name)} --hash=sha256:{sha256_file(w)}  # {w.name}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def read_lock(path: Path) -> tuple[str | None, list[tuple[str, str]]]:
    """(inputs-sha256, [(file name, sha256)]) of a lock written by write_lock."""
    key, entries = None, []
    for line in path.read_text().splitlines():
        if line.startswith("# inputs-sha256:"):
            key = line.split(":", 1)[1].strip()
        m = re.match(r"^\S+==\S+ --hash=sha256:([0-9a-f]{64})\s+#\s+(\S+\.whl)$", line)
        if m:
            entries.append((m.group(2), m.group(1)))
    return key, entries


def pip(*args: str) -> None:
    run([sys.executable, "-m", "pip", *args])


def ensure_wheelhouse(flavor: str, target: Target, timer: Timer) -> tuple[Path, list[Path]]:
    """The lock for `flavor` and its wheels under WHEELS; resolves afresh only when inputs changed."""
    inputs, lock = lock_inputs(flavor), lock_path(flavor, target)
    WHEELS.mkdir(parents=True, exist_ok=True)
    key, entries = read_lock(lock) if lock.exists() else (None, [])
    if key != inputs_key(inputs, target) or not entries:
        with timer.stage(f"wheelhouse: resolve {flavor} (lock {lock.name})"):
            stage = Path(tempfile.mkdtemp(prefix="resolve-", dir=CACHE))
            try:
                reqs = stage / "inputs.txt"
                reqs.write_text("\n".join(inputs) + "\n")
                # Reuse wheels already here; pip's configuration decides where the rest come from.
                got = run([sys.executable, "-m", "pip", "download", "--dest", str(stage / "w"), "--find-links",
                           str(WHEELS), *target.pip_args, "-r", str(reqs)], check=False)
                if got.returncode != 0:
                    build_sdists(stage, reqs, target)
                wheels = sorted((stage / "w").glob("*.whl"))
                others = [p.name for p in (stage / "w").iterdir() if p.suffix != ".whl"]
                if others:
                    raise BuildError(f"not wheels after resolving: {', '.join(others)}")
                for w in wheels:
                    if not (WHEELS / w.name).exists():
                        os.replace(w, WHEELS / w.name)
                write_lock(lock, flavor, inputs, target, [WHEELS / w.name for w in wheels])
            finally:
                shutil.rmtree(stage, ignore_errors=True)
        key, entries = read_lock(lock)
    with timer.stage(f"wheelhouse: check {flavor} ({len(entries)} wheels)"):
        missing = [name for name, digest in entries if not (WHEELS / name).exists()]
        if missing:
            print(f"{len(missing)} locked wheels not in {WHEELS}: downloading them")
            pip("download", "--no-deps", "--require-hashes", "--dest", str(WHEELS), *target.pip_args, "-r", str(lock))
        bad = [name for name, digest in entries if sha256_file(WHEELS / name) != digest]
        if bad:
            raise BuildError(f"{lock}: hash mismatch for {', '.join(bad)} (delete them from {WHEELS})")
    return lock, [WHEELS / name for name, _ in entries]


def build_sdists(stage: Path, reqs: Path, target: Target) -> None:
    """Packages with no wheel for the target: build them with `pip wheel` (host Python must match)."""
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if host != target.python:
        raise BuildError(f"resolving wheels failed, and sdists can only be built for Python {host} here "
                         f"(the image has {target.python})")
    pip("wheel", "--wheel-dir", str(stage / "w"), "--find-links", str(WHEELS), "-r", str(reqs))


# ---------------------------------------------------------------------------------------------
# build context


def source_files() -> list[Path]:
    """The project's files that go in: tracked plus untracked-but-not-ignored, under SOURCE_PATHS."""
    try:
        out = run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *SOURCE_PATHS],
                  capture=True, cwd=ROOT).stdout
        return [ROOT / p for p in sorted(set(out.split("\0"))) if p and (ROOT / p).is_file()]
    except (BuildError, OSError):
        found = [p for s in SOURCE_PATHS for p in ([ROOT / s] if (ROOT / s).is_file() else (ROOT / s).rglob("*"))]
        return sorted(p for p in found if p.is_file() and "__pycache__" not in p.parts)


def make_context(flavor: str, lock: Path, wheels: list[Path]) -> Path:
    """context-<flavor>/: wheels/ (hard links, only what the lock names), requirements.lock, src/."""
    ctx = CACHE / f"context-{flavor}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheels").mkdir(parents=True)
    for w in wheels:
        try:
            os.link(w, ctx / "wheels" / w.name)
        except OSError:
            shutil.copy2(w, ctx / "wheels" / w.name)
    shutil.copy2(lock, ctx / "requirements.lock")
    for f in source_files():
        dest = ctx / "src" / f.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    return ctx


# ---------------------------------------------------------------------------------------------
# actions


def base_for(engine: Engine, requested: str | None, default: str, timer: Timer, rebuild_base: bool) -> tuple[str, bool]:
    """(base image, is the local debootstrap base): the requested or default base when the engine can
    pull it, else the local base."""
    ref = requested or default
    if ref == BASE_IMAGE:
        ensure_base(engine, timer, rebuild_base)
        return BASE_IMAGE, True
    with timer.stage(f"base: pull {ref}"):
        if engine.exists(ref) or engine.pull(ref):
            return ref, False
    if requested:
        raise BuildError(f"cannot pull {ref} (no registry?); leave --base out to use the local Debian base")
    print(f"no registry answers for {ref}: using the local Debian base")
    ensure_base(engine, timer, rebuild_base)
    return BASE_IMAGE, True


def recorded_args(base: str, ref: str) -> dict[str, str]:
    """Build args the image keeps as ENV, for the run manifests written inside it."""
    sha, dirty = git_tag()
    return {"BASE": base, "DRAFTER_LAB_IMAGE": ref, "GIT_SHA": sha if sha != "nogit" else "unknown",
            "GIT_DIRTY": str(dirty).lower()}


def build_cpu(engine: Engine, opts, timer: Timer) -> str:
    base, local = base_for(engine, opts.base, "debian:bookworm", timer, opts.rebuild_base)
    target = Target("3.11", BOOKWORM_PLATFORM)
    lock, wheels = ensure_wheelhouse("cpu", target, timer)
    ref = f"localhost/drafter-lab-cpu:{image_tag()}"
    with timer.stage("context"):
        ctx = make_context("cpu", lock, wheels)
    with timer.stage(f"build {ref}"):
        engine.build(HERE / "Containerfile.cpu", ctx, [ref, "localhost/drafter-lab-cpu:latest"],
                     recorded_args(base, ref), {}, local, opts.no_cache)
    print(f"built {ref} ({engine.digest(ref)})")
    return ref


def smoke_tests(file: Path = SMOKE_TESTS_FILE) -> list[str]:
    """Test paths for the smoke: $DRAFTER_LAB_SMOKE_TESTS (space-separated) or smoke-tests.txt."""
    env = os.environ.get(SMOKE_TESTS_ENV)
    if env:
        return env.split()
    lines = (line.split("#", 1)[0].strip() for line in file.read_text().splitlines())
    return [line for line in lines if line]


# Run inside the image after the smoke experiment: the manifest names this image and this commit.
MANIFEST_CHECK = """
import json, sys
path, digest, sha = sys.argv[1:]
sha = None if sha == "-" else sha
m = json.load(open(path))
got = ((m.get("container") or {}).get("digest"), (m.get("git") or {}).get("sha"))
if got != (digest, sha):
    sys.exit(f"{path}: (image digest, git sha) is {got}, expected {(digest, sha)}")
print(f"manifest: image {digest}, git {sha} dirty={m['git'].get('dirty')}, packages {m['packages']}")
"""


def smoke(engine: Engine, opts, timer: Timer) -> None:
    """In the CPU image: the fast tests, the `smoke` study, its manifest, and `reproduce` of that run
    from an empty cache (pair, data, source drafter and arms all built again), which must report
    identical metrics."""
    ref = f"localhost/drafter-lab-cpu:{image_tag()}"
    if not engine.exists(ref):
        raise BuildError(f"{ref} is not built: run `python3 containers/build.py` first")
    out = Path(opts.runs).resolve() if opts.runs else Path(tempfile.mkdtemp(prefix="drafter-lab-smoke-"))
    if opts.runs and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BuildError(f"{out}: --runs must name a new or empty directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file above it
        raise BuildError(f"{out}: --runs cannot be made ({e.strerror})") from None
    digest, (sha, _) = engine.digest(ref), git_tag()
    # One torch thread: the models are tiny, and OpenMP threads spin-wait whenever another process
    # holds a core (the smoke study took 14 min with 2 threads on a busy 2-core machine, 44 s with 1).
    env = {"DRAFTER_LAB_IMAGE_DIGEST": digest, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    vols = {str(out): "/tmp/runs"}
    run_dir = "/tmp/runs/smoke"
    steps = [
        ("smoke: tests", ["sh", "-c", "cd /opt/drafter-lab && exec pytest -q -p no:cacheprovider -m 'not slow' "
                          + " ".join(smoke_tests())]),
        ("smoke: experiment --config smoke", ["drafter-lab", "experiment", "--config", "smoke", "--runs", "/tmp/runs",
                                              "--run-dir", run_dir, "--cache", "/tmp/runs/cache"]),
        ("smoke: manifest", ["python", "-c", MANIFEST_CHECK, f"{run_dir}/manifest.json", digest,
                             sha if sha != "nogit" else "-"]),
        ("smoke: reproduce (empty cache)", ["drafter-lab", "reproduce", run_dir, "--runs", "/tmp/runs",
                                            "--cache", "/tmp/runs/cache-reproduce"]),
    ]
    for name, cmd in steps:
        with timer.stage(name):
            rc = engine.run_in(ref, cmd, env, vols)
        if rc != 0:
            raise BuildError(f"{name} failed (exit {rc}) in {ref}; output in {out}")
    print(f"smoke passed in {ref}; runs in {out}")


def gpu(engine: Engine, opts, timer: Timer) -> None:
    """The GPU Containerfile. On the local base it compiles against the host's CUDA (bind-mounted)."""
    base, local = base_for(engine, opts.base, GPU_BASE, timer, opts.rebuild_base)
    volumes = {}
    if local:
        cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")).resolve()
        if not (cuda / "bin" / "nvcc").exists():
            raise BuildError(f"{cuda}/bin/nvcc not found: the local base needs the host's CUDA toolkit (CUDA_HOME)")
        volumes[str(cuda)] = "/usr/local/cuda:ro"
        target = Target("3.11", BOOKWORM_PLATFORM)
    else:
        target = Target(opts.python or "3.12", UBUNTU_2404_PLATFORM)
    lock, wheels = ensure_wheelhouse("gpu", target, timer)
    name = "localhost/drafter-lab-gpu-localbase" if local else "localhost/drafter-lab-gpu"
    ref = f"{name}:{image_tag()}"
    with timer.stage("context"):
        ctx = make_context("gpu", lock, wheels)
    with timer.stage(f"build {ref}"):
        engine.build(HERE / "Containerfile", ctx, [ref, f"{name}:latest"],
                     {**recorded_args(base, ref), "TORCH_CUDA_ARCH_LIST": CUDA_ARCHS, "MAX_JOBS": str(os.cpu_count() or 4)},
                     volumes, local, opts.no_cache)
    # Without a GPU the check is what the image holds: CUDA torch, sglang, and SASS for every arch.
    so = "$(python -c 'import torch, drafter_lab._C as C; print(C.__file__)')"
    check = ("python -c \"import torch, sglang, drafter_lab._C as C; print('torch', torch.__version__, "
             "'cuda', torch.version.cuda, 'sglang', sglang.__version__)\" && "
             f"python /containers/fatbin_archs.py {so} --expect {','.join(a.replace('.', '') for a in CUDA_ARCHS.split(';'))}")
    with timer.stage("gpu: check image"):
        rc = engine.run_in(ref, ["sh", "-c", check], {}, {**volumes, str(HERE): "/containers:ro"})
    if rc != 0:
        raise BuildError(f"the GPU image {ref} failed its check (imports, SASS for {CUDA_ARCHS}); exit {rc}")
    print(f"built {ref} ({engine.digest(ref)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="containers/build.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="build", choices=["build", "smoke", "gpu"])
    ap.add_argument("--engine", choices=sorted(ENGINES), help="default: docker (daemon up), buildah, podman")
    ap.add_argument("--base", help="base image (default: the registry's one, else the local Debian base)")
    ap.add_argument("--python", help="the GPU base's Python (default 3.12 for the CUDA Ubuntu 24.04 base)")
    ap.add_argument("--install-tools", action="store_true", help="apt-get install buildah podman debootstrap")
    ap.add_argument("--rebuild-base", action="store_true", help="debootstrap the local base again")
    ap.add_argument("--no-cache", action="store_true", help="build every layer again")
    ap.add_argument("--runs", help="smoke: where the runs land (a new or empty directory; default a temp one)")
    opts = ap.parse_args(argv)
    timer = Timer()
    try:
        engine = detect_engine(opts.engine)
        need_tools = engine is None or (opts.action != "smoke" and shutil.which("debootstrap") is None)
        if need_tools and (opts.install_tools or os.environ.get("CI") == "true"):
            with timer.stage("tools: apt-get install buildah podman debootstrap"):
                install_tools()
            engine = detect_engine(opts.engine)
        if engine is None:
            raise BuildError("no container engine (docker with a daemon, buildah or podman); "
                             "rerun with --install-tools")
        print(f"engine: {engine.name} ({engine.exe})")
        {"build": build_cpu, "smoke": smoke, "gpu": gpu}[opts.action](engine, opts, timer)
    except BuildError as e:
        print(timer.summary())
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(timer.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
