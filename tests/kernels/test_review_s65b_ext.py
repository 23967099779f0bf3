"""Pins from the s65 mutation audit of kernels/_ext.py: an extension that does not load is a LabError
naming the build command, not an ImportError deep in a kernel call."""

from __future__ import annotations

import sys

import pytest

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext


@pytest.fixture
def missing_ext(monkeypatch):
    monkeypatch.setitem(sys.modules, "drafter_lab._C", None)  # `import drafter_lab._C` now raises ImportError
    _ext._import.cache_clear()
    yield
    _ext._import.cache_clear()


def test_a_missing_extension_is_a_lab_error_with_the_build_hint(missing_ext):
    assert not _ext.available()
    reason = _ext.unavailable_reason()
    assert reason.startswith("drafter_lab._C is not built or does not load") and _ext.BUILD_HINT in reason
    with pytest.raises(LabError, match="pip install --no-build-isolation -e ."):
        _ext.load()
    with pytest.raises(LabError):
        _ext.cpu_isa()


@pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")
def test_a_built_extension_has_no_reason():
    assert _ext.unavailable_reason() == "" and _ext.cpu_isa() in ("avx2", "portable")
