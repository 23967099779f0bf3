"""Every way drafter_lab is used runs as a nox session, here or in a container.

    nox -s experiment            the lab's main job (default config tiny-cpu)
    nox -s tests                 the test suite (CPU; GPU tests skip with a reason)
    nox -s lint                  ruff
    nox -s kernels               the kernel correctness suites (GPU parts skip without a GPU)
    nox -s bench -- NAME         kernel benchmarks: allreduce | draft-forward
    nox -s container [-- smoke]  build the CPU/GPU images offline; smoke runs the lab inside
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

CPU_TORCH = "torch==2.13.0"  # the CPU build; a bare `torch` would pull a multi-GB CUDA build


def install_lab(session: nox.Session, torch_spec: str = CPU_TORCH, extras: str = "test") -> None:
    session.install("--upgrade", "pip", "setuptools>=68", "wheel", "pybind11", "ninja")
    session.install(torch_spec)
    session.install("--no-build-isolation", "-e", f".[{extras}]" if extras else ".")


@nox.session
def tests(session: nox.Session) -> None:
    """Fresh venv, CPU torch, the package and its extension; then pytest."""
    install_lab(session)
    session.run("pytest", "-q", "--timeout=900", *session.posargs, env={"OMP_NUM_THREADS": "2"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "drafter_lab", "tests", "noxfile.py", "setup.py")


@nox.session
def experiment(session: nox.Session) -> None:
    """The study: `nox -s experiment -- --config NAME` (default tiny-cpu)."""
    install_lab(session, extras="")
    args = session.posargs or ["--config", "tiny-cpu"]
    session.run("drafter-lab", "experiment", *args, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})


@nox.session
def kernels(session: nox.Session) -> None:
    """Correctness suites of the compiled ops against their PyTorch references."""
    install_lab(session)
    session.run("pytest", "-q", "tests/kernels", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """`nox -s bench -- allreduce|draft-forward [ARGS]`: prints tables, writes JSON for the cost model."""
    names = {"allreduce": "drafter_lab.kernels.bench_allreduce", "draft-forward": "drafter_lab.kernels.bench_draft_forward"}
    if not session.posargs or session.posargs[0] not in names:
        session.error(f"name a benchmark: {' | '.join(names)}")
    install_lab(session, extras="")
    session.run("python", "-m", names[session.posargs[0]], *session.posargs[1:])


@nox.session(venv_backend="none")
def container(session: nox.Session) -> None:
    """Build the images with whichever engine exists (docker, podman, buildah); `-- smoke` runs inside."""
    session.run("python3", "containers/build.py", *session.posargs, external=True)
