"""README "Kernels (csrc/)" walked as a newcomer (review s63): `--breakdown` on the CPU and a relative
`OUT=DIR` for device_check.sh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("device_check.sh")


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_breakdown_on_the_cpu_is_refused_not_ignored(device, capsys):
    """`bench draft-forward --breakdown` on the CPU timed the table and printed no breakdown, silently."""
    from drafter_lab.kernels import bench_draft_forward as bench

    with pytest.raises(SystemExit) as e:
        bench.parse(["--device", device, "--breakdown"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--breakdown" in err and "CUDA" in err
    assert bench.parse(["--device", device]).breakdown is False  # the plain CPU run still parses


def test_a_compile_mode_on_the_cpu_is_refused_not_named(capsys):
    """On the CPU the header said "torch.compile mode default" though the compile baseline only runs on CUDA."""
    from drafter_lab.kernels import bench_draft_forward as bench

    assert bench.parse(["--device", "cpu"]).compile_mode == "none"
    assert bench.parse(["--device", "cpu", "--compile-mode", "none"]).compile_mode == "none"
    assert bench.parse(["--device", "cuda"]).compile_mode == "default"
    with pytest.raises(SystemExit) as e:
        bench.parse(["--device", "cpu", "--compile-mode", "max-autotune"])
    assert e.value.code == 2 and "CUDA only" in capsys.readouterr().err


def test_a_relative_out_is_taken_from_where_the_script_is_called(tmp_path):
    """The script cds to the checkout first, so `OUT=out` from another directory wrote the log into the
    checkout's out/; a relative PYTHON path likewise named a file under the checkout."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "py"
    fake.write_text("#!/bin/sh\necho fake python \"$@\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "OUT": "out", "PYTHON": "bin/py"}
    run = subprocess.run(["bash", str(SCRIPT), "replay"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    log = (tmp_path / "out" / "device_check.log").read_text()
    assert "fake python -m drafter_lab.train.bench_replay" in log
