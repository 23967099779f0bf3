"""Every way drafter_lab is used runs as a nox session, here or in a container.

    nox -s experiment            the lab's main job (default config tiny-cpu)
    nox -s tests                 the test suite (CPU; GPU tests skip with a reason)
    nox -s tests_gpu_stack       the suites that load models, with the GPU image's transformers stack
    nox -s lint                  ruff
    nox -s kernels               the kernel correctness suites (GPU parts skip without a GPU)
    nox -s build_cuda            compile the CUDA sources (CUDA torch + nvcc; no GPU needed)
    nox -s bench -- NAME         benchmarks: allreduce | draft-forward (kernels) | verify (target passes) | replay
    nox -s container [-- smoke]  build the CPU/GPU images offline; smoke runs the lab inside
    nox -s reproduce -- RUN_DIR  re-run a run (made here or in an image) and list what differs
"""

from __future__ import annotations

import json
import os
import re

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

# The CPU build as the lab's machines' package index serves it (a bare `torch` resolves there to the
# 5.5 GB CUDA build). An index whose torch wheels carry CUDA needs PIP_INDEX_URL (or
# PIP_EXTRA_INDEX_URL) pointed at a CPU-wheel index for these sessions to stay small.
CPU_TORCH = "torch==2.13.0"
CUDA_TORCH = "torch==2.14.1"  # the CUDA 13.0 build (about 5.5 GB installed)
RUFF = "ruff==0.17.6"  # pinned: a release that adds checks to the selected rules would fail a clean commit
# What the extension build needs besides torch, as containers/build.py locks it (torch ships the pybind11
# headers): anything else would install unpinned.
BUILD_TOOLS = ("setuptools>=68", "wheel", "ninja")

# Run inside build_cuda: load the freshly built library and check what a GPU machine would rely on.
CHECK_CUDA_BUILD = """
import glob, importlib.util, os, subprocess, sys
import torch
lib = glob.glob(os.path.join(sys.argv[1], "drafter_lab", "_C*.so"))[0]
spec = importlib.util.spec_from_file_location("drafter_lab._C", lib)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
for op in ("drafter_lab::draft_step",):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"), f"{op}: no CUDA kernel in {lib}"
tools = [os.path.join(os.environ["CUDA_HOME"], "bin", "cuobjdump")]
try:  # the CUDA toolkit here may lack cuobjdump; the Triton that CUDA torch pulls in carries one
    import triton
    tools.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
except ImportError:
    pass
tool = next((t for t in tools if os.path.exists(t)), None)
assert tool, f"no cuobjdump among {tools}"
elf = subprocess.run([tool, "--list-elf", lib], capture_output=True, text=True, check=True).stdout
want = sys.argv[2:]
missing = [a for a in want if a not in elf]
assert not missing, f"{lib} has no code for {missing}"
print(f"{os.path.basename(lib)}: CUDA kernels registered; machine code for {', '.join(want)}")
"""


# The sessions install what the images locked (CPU sessions the CPU image's, build_cuda the GPU image's),
# so a library release can't turn a green commit red or make the host's runs differ from the image's.
# DRAFTER_LAB_NEWEST=1 takes the newest releases instead.
LOCKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "containers")
CPU_LOCK = os.path.join(LOCKS, "requirements-cpu.lock")
GPU_LOCK = os.path.join(LOCKS, "requirements-gpu.lock")


def lock_constraints(lock_text: str) -> list[str]:
    """`name==version` for each package a lock written by containers/build.py pins, torch excepted (each
    session names its own build; the CPU lock's carries a local version tag)."""
    pins = []
    for line in lock_text.splitlines():
        spec = line.split("#", 1)[0].split()
        if spec and "==" in spec[0] and spec[0].split("==")[0] != "torch":
            pins.append(spec[0])
    return pins


def constrained(session: nox.Session, lock: str, name: str = "constraints.txt") -> list[str]:
    """pip arguments that hold an install to `lock`'s versions (none with DRAFTER_LAB_NEWEST=1)."""
    if os.environ.get("DRAFTER_LAB_NEWEST") == "1":
        return []
    with open(lock) as f:
        pins = lock_constraints(f.read())
    path = os.path.join(session.virtualenv.location, name)  # create_tmp() would also move TMPDIR
    with open(path, "w") as f:
        f.write("\n".join(pins) + "\n")
    return ["-c", path]


def install_lab(session: nox.Session, torch_spec: str = CPU_TORCH, extras: str = "test") -> None:
    c = constrained(session, CPU_LOCK)
    session.install(*c, "--upgrade", "pip", *BUILD_TOOLS)
    session.install(*c, torch_spec)
    session.install(*c, "--no-build-isolation", "-e", f".[{extras}]" if extras else ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Fresh venv, CPU torch, the package and its extension; then pytest."""
    install_lab(session)
    session.run("pytest", "-q", "--timeout=900", *session.posargs, env={"OMP_NUM_THREADS": "2"})


# The libraries between the lab and a model, as the GPU image pins them: SGLang holds them behind the CPU
# image's (transformers 5.19 against 5.24), and an API that moved between the two passed CPU CI and broke on
# a GPU (a per-row logits_to_keep, which 5.19 broadcasts into [B, B, V] logits).
GPU_MODEL_STACK = ("transformers", "huggingface-hub", "tokenizers")
MODEL_SUITES = ("tests/spec", "tests/targets", "tests/data", "tests/drafter")


@nox.session
def tests_gpu_stack(session: nox.Session) -> None:
    """The suites that load models, on CPU torch with the GPU image's transformers stack (no GPU needed)."""
    install_lab(session)
    session.install(*constrained(session, GPU_LOCK, "constraints-gpu.txt"), *GPU_MODEL_STACK)
    session.run("pytest", "-q", "--timeout=900", *(session.posargs or MODEL_SUITES), env={"OMP_NUM_THREADS": "2"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", "drafter_lab", "tests", "noxfile.py", "setup.py")


@nox.session
def experiment(session: nox.Session) -> None:
    """The study: `nox -s experiment -- --config NAME` (default tiny-cpu)."""
    install_lab(session, extras="")
    args = session.posargs or ["--config", "tiny-cpu"]
    session.run("drafter-lab", "experiment", *args, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})


# Libraries whose recorded versions `reproduce` installs: a newer release may save or round differently
# (transformers writes its version into every config.json). Torch is the session's own CPU build.
RECORDED_PACKAGES = ("transformers", "tokenizers", "safetensors", "numpy")


def recorded_versions(args: list[str]) -> list[str]:
    """`name==version` for each of RECORDED_PACKAGES that the run directory among `args` recorded in its
    manifest.json; none without a readable one (`drafter-lab reproduce` then says what is wrong)."""
    manifest = next((m for m in (os.path.join(a, "manifest.json") for a in args) if os.path.isfile(m)), None)
    if manifest is None:
        return []
    try:
        with open(manifest) as f:
            packages = json.load(f).get("packages") or {}
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object
        return []
    if not isinstance(packages, dict):
        return []
    return [f"{name}=={packages[name]}" for name in RECORDED_PACKAGES if isinstance(packages.get(name), str)]


@nox.session
def reproduce(session: nox.Session) -> None:
    """Re-run a run directory's config here, with the library versions it recorded, and compare:
    `nox -s reproduce -- RUN_DIR [--cache DIR]`."""
    if not session.posargs:  # before minutes of installing and compiling
        session.error("name a run directory: nox -s reproduce -- RUN_DIR [--cache DIR]")
    install_lab(session, extras="")
    pins = recorded_versions(session.posargs)
    if pins:
        session.install(*pins)
    session.run("drafter-lab", "reproduce", *session.posargs, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})


@nox.session
def kernels(session: nox.Session) -> None:
    """Correctness suites of the compiled ops against their PyTorch references, and decoding through
    the fused draft step."""
    install_lab(session)
    session.run("pytest", "-q", "tests/kernels", "tests/spec/test_fused_decoding.py", *session.posargs)


def machine_code(archs: str) -> list[str]:
    """The ELF architectures a TORCH_CUDA_ARCH_LIST asks for, as cuobjdump names them: entries split by
    ";" or spaces, "+PTX" (which adds PTX beside the machine code) dropped, "9.0a" -> sm_90a."""
    return ["sm_" + a.split("+")[0].replace(".", "") for a in re.split(r"[;\s]+", archs) if a]


@nox.session
def build_cuda(session: nox.Session) -> None:
    """Compile the CUDA sources with the CUDA torch build and nvcc (CUDA_HOME); no GPU needed.
    Builds outside the source tree, so the CPU sessions' in-place extension is left alone."""
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        session.error(f"no nvcc under CUDA_HOME={cuda_home}")
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "8.0;9.0;12.0")
    c = constrained(session, GPU_LOCK)
    session.install(*c, "--upgrade", "pip", *BUILD_TOOLS)
    session.install(*c, CUDA_TORCH)
    out = session.create_tmp()
    env = {"CUDA_HOME": cuda_home, "TORCH_CUDA_ARCH_LIST": archs}
    session.run("python", "setup.py", "-q", "build_ext", "-b", f"{out}/lib", "-t", f"{out}/obj", env=env)
    session.run("python", "-c", CHECK_CUDA_BUILD, f"{out}/lib", *machine_code(archs), env=env)


@nox.session
def bench(session: nox.Session) -> None:
    """`nox -s bench -- allreduce|draft-forward|verify|replay [ARGS]`: prints tables; `allreduce --tp-sim`,
    `allreduce --json FILE`, `draft-forward --json FILE` and `verify --json FILE` also write JSON for the cost model."""
    if not session.posargs:
        session.error("name a benchmark: allreduce | draft-forward | verify | replay")
    install_lab(session, extras="")
    session.run("drafter-lab", "bench", *session.posargs)


@nox.session(venv_backend="none")
def container(session: nox.Session) -> None:
    """Build the images with whichever engine exists (docker, buildah, podman); `-- smoke` runs inside."""
    session.run("python3", "containers/build.py", *session.posargs, external=True)
