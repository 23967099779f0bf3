"""README, "Kernels": `OUT=DIR bash tests/kernels/device_check.sh` builds `_C` for the GPU present.

The build step used to default TORCH_CUDA_ARCH_LIST to 9.0 whatever the GPU, so on an A100 (8.0),
a B200 (10.0) or an RTX 5090 (12.0) every GPU test met an extension with no kernel it could load.
Python is stood in by a script that answers the capability query and records what setup.py got.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "kernels" / "device_check.sh"


def _built_for(tmp_path: Path, capability: str | None, **env) -> str:
    """The TORCH_CUDA_ARCH_LIST that device_check.sh's build step hands setup.py."""
    fake = tmp_path / "python"
    answer = f"echo {capability}" if capability else "echo 'no CUDA GPU' >&2; exit 1"
    fake.write_text("#!/bin/sh\n"
                    'case "$*" in\n'
                    f"  *get_device_capability*) {answer} ;;\n"
                    '  *setup.py*) echo "built for $TORCH_CUDA_ARCH_LIST" ;;\n'
                    "esac\n")
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "TORCH_CUDA_ARCH_LIST"}
    out = tmp_path / "out"
    run = subprocess.run(["bash", str(SCRIPT), "build"], capture_output=True, text=True, timeout=60,
                         env={**base, "OUT": str(out), "PYTHON": str(fake), **env})
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [ln for ln in (out / "device_check.log").read_text().splitlines() if ln.startswith("built for ")]
    assert len(lines) == 1, run.stdout
    return lines[0].removeprefix("built for ")


@pytest.mark.parametrize("capability", ["8.0", "9.0", "10.0", "12.0"])
def test_the_build_targets_the_gpu_present(tmp_path, capability):
    assert _built_for(tmp_path, capability) == capability


def test_an_arch_list_given_wins(tmp_path):
    assert _built_for(tmp_path, "8.0", TORCH_CUDA_ARCH_LIST="8.6;9.0+PTX") == "8.6;9.0+PTX"


def test_without_a_gpu_it_builds_for_9_0(tmp_path):
    assert _built_for(tmp_path, None) == "9.0"
