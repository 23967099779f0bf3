"""tests/kernels/device_check.sh runs the steps it is named, in that order (python stood in by echo)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("device_check.sh")


def _run(tmp_path, *names, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *names], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path), "PYTHON": "echo", **env})


def _steps(tmp_path, *names, **env) -> list[str]:
    run = _run(tmp_path, *names, **env)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = run.stdout.split("== summary\n", 1)[1].splitlines()
    return [line.split()[0] for line in summary]


def test_bench_is_its_five_parts_in_order(tmp_path):
    assert _steps(tmp_path, "bench") == ["breakdown_pdl1", "breakdown_pdl0", "bench_draft_forward", "gemv_blocks3",
                                         "gemv_blocks2", "random_target", "bench_verify", "bench_replay"]


def test_parts_run_in_the_order_named(tmp_path):
    assert _steps(tmp_path, "replay", "table", "allreduce", ALLREDUCE_BLOCKS="4") == [
        "bench_replay", "bench_draft_forward", "bench_allreduce_4ctas"]


def test_an_unknown_step_is_refused_before_any_runs(tmp_path):
    """Also one that contains a step's name ("benchmark" is not "bench")."""
    run = _run(tmp_path, "table", "benchmark")
    assert run.returncode == 2 and "unknown step: benchmark" in run.stdout
    assert "== bench_draft_forward" not in run.stdout


@pytest.mark.parametrize("step", ["breakdown", "gemv"])
def test_each_step_logs_its_command(tmp_path, step):
    _steps(tmp_path, step)
    assert "drafter_lab.kernels.bench_draft_forward" in (tmp_path / "device_check.log").read_text()
