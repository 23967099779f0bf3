"""Real processes, 2 gloo ranks under torchrun: a rank whose command succeeded exits 0, even when a gloo
worker thread lets go of a collective's tensor while the interpreter is finalizing (it aborted the process,
"terminate called without an active exception", and torchrun reported a finished train run FAILED)."""

from __future__ import annotations

import subprocess
import sys

from .test_resume_ddp import env

SCRIPT = """
import contextlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from drafter_lab.cli import main
from drafter_lab.train import distributed

d = distributed.setup("cpu")
model = DistributedDataParallel(torch.nn.Linear(4, 4))  # as train's: it keeps gloo's group alive past its destroy


class SlowTeardown:
    def __del__(self):
        time.sleep(3)  # holds the interpreter's finalization open while rank 1's collective finishes


if d.rank == 1:
    # Its tensor is dropped at once: the gloo thread holds the last reference and lets go of it once rank 0
    # joins, which is after this rank's command has returned.
    dist.all_reduce(torch.ones(8), async_op=True)
    teardown = SlowTeardown()
else:
    time.sleep(1.5)
    with contextlib.suppress(RuntimeError):  # rank 1 may be gone already: what is checked is how it ended
        dist.all_reduce(torch.ones(8))
raise SystemExit(main(["costmodel", "--preset", "seeds-kimi-k2.5-8x-pcie"]))
"""


def test_a_rank_exits_0_when_gloo_lets_go_of_a_tensor_during_its_teardown(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=120)
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("cost model: seeds-kimi-k2.5-8x-pcie") == 2, "each rank's command ran to its end"


def test_a_process_not_in_a_group_returns_from_the_cli():
    """Only a process still in the group it joined ends there: after a join that did not hold (a test's
    stub), main returns as ever. A subprocess: an exit here would end pytest itself, with status 0."""
    code = """
import torch.distributed as dist
from drafter_lab.cli import main
from drafter_lab.train import distributed

distributed._joined = True  # what setup() leaves, without a group (is_initialized() is False)
assert not dist.is_initialized()
print("returned", main(["costmodel", "--preset", "seeds-kimi-k2.5-8x-pcie"]))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("returned 0")
