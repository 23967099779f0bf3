"""The compiled extension drafter_lab._C: import it once, or say clearly why it is not there."""

from __future__ import annotations

import functools
from types import ModuleType

from drafter_lab.errors import LabError

BUILD_HINT = "build it with `pip install --no-build-isolation -e .` (needs a C++ compiler; CUDA parts need nvcc)"


@functools.cache
def _import() -> tuple[ModuleType | None, str]:
    import torch  # noqa: F401  (loads libtorch/libc10, which _C links against)

    try:
        import drafter_lab._C as ext
    except ImportError as e:  # not built, or built against another torch (undefined symbols)
        return None, f"drafter_lab._C is not built or does not load ({e}); {BUILD_HINT}"
    return ext, ""


def available() -> bool:
    """True when drafter_lab._C imports."""
    return _import()[0] is not None


def unavailable_reason() -> str:
    """Why drafter_lab._C does not import ("" when it does): for skip messages and errors."""
    return _import()[1]


def load() -> ModuleType:
    """The extension module; raises LabError naming the problem and the build command."""
    ext, reason = _import()
    if ext is None:
        raise LabError(reason)
    return ext


def cpu_isa() -> str:
    """Which build of the CPU loops this CPU runs ("avx2" or "portable"), for benchmark headers."""
    return load().cpu_isa()
