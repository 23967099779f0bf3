"""A `_Run` method on a stub run in two real gloo processes, as srun or mpirun start them (no torchrun
to kill a rank left waiting in a collective): each rank's exit status and output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .test_resume_ddp import env

SCRIPT = """
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

from drafter_lab.errors import LabError
from drafter_lab.train.distributed import Dist
from drafter_lab.train.loop import _Run

rank, store, method, args = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
# SETUP
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
run = types.SimpleNamespace(d=Dist(rank, 2, 0, torch.device("cpu")), **fields)
for name in ("rank0", "rank0_writes"):  # how _Run's methods share a failure of rank 0: _Run's own, on the stub
    setattr(run, name, types.MethodType(getattr(_Run, name), run))
code = 0
try:
    getattr(_Run, method)(run)
except LabError as e:
    print(f"error: {e}")
    code = 2
dist.destroy_process_group()  # as the lab's atexit does: gloo's threads alive at exit abort the process
sys.exit(code)
"""


def run_two_ranks(tmp_path: Path, setup: str, method: str, *args) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) of ranks 0 and 1, each calling `_Run.<method>` on a stub whose
    attributes the code `setup` puts in `fields` (it sees `rank` and the string `args`)."""
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT.replace("# SETUP\n", setup))
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), method, *map(str, args)],
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        done = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, done)]
