"""Builds drafter_lab, and its compiled extension drafter_lab._C when csrc/ holds sources.

C++ sources under csrc/ always build; CUDA sources (*.cu) build too when torch has CUDA and
nvcc is found (CUDA_HOME). The extension needs torch at build time, so install with
`pip install --no-build-isolation .` after torch (noxfile.py does this).
"""

import os
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
CSRC = ROOT / "csrc"


def _sources(pattern: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in CSRC.rglob(pattern)) if CSRC.is_dir() else []


def _extensions():
    cpp = _sources("*.cpp")
    if not cpp:
        return [], {}
    from torch.utils import cpp_extension

    cu = _sources("*.cu")
    # No -std flag: torch's builder passes the standard its headers need (C++20 from torch 2.14).
    with_cuda = bool(cu) and cpp_extension.CUDA_HOME is not None and _torch_has_cuda()
    cxx = ["-O3", "-fopenmp"]  # OpenMP: at::parallel_for is single-threaded without it
    kwargs = dict(
        name="drafter_lab._C",
        sources=cpp + (cu if with_cuda else []),
        include_dirs=[str(CSRC)],
        extra_compile_args={"cxx": cxx + (["-DDRAFTER_LAB_WITH_CUDA"] if with_cuda else [])},
        extra_link_args=["-fopenmp"],
    )
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0;12.0")
        kwargs["extra_compile_args"]["nvcc"] = ["-O3", "--use_fast_math", "-lineinfo"]
        ext = cpp_extension.CUDAExtension(**kwargs)
    else:
        ext = cpp_extension.CppExtension(**kwargs)
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


def _torch_has_cuda() -> bool:
    import torch

    return torch.version.cuda is not None


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
