"""bench verify as the device check runs it: `python -m drafter_lab.spec.bench_verify`."""

from __future__ import annotations

import subprocess
import sys


def test_the_module_runs_as_a_script_and_refuses_a_missing_target(tmp_path):
    missing = tmp_path / "no-target"
    r = subprocess.run([sys.executable, "-m", "drafter_lab.spec.bench_verify", "--target", str(missing)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert str(missing) in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
