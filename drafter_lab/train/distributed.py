"""torchrun support: process group setup (gloo on CPU, NCCL on GPU) and count reductions.

Without torchrun's environment everything degrades to a single process and no-op reductions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist

from drafter_lab.errors import LabError


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Only this process writes files."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce a sum (in place on a copy); identity in a single process."""
        if not self.active:
            return t
        t = t.clone()
        dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    # The devices a run trains on: torch takes others (meta, mps) and fails later, or refuses gpu with a traceback.
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise LabError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LabError(f"device {name!r} requested but no CUDA device is visible")
        dev = torch.device(name if ":" in name else f"cuda:{local_rank}")
        if dev.index >= torch.cuda.device_count():
            raise LabError(f"device {str(dev)!r}: only {torch.cuda.device_count()} CUDA devices are visible")
        return dev
    return torch.device(name)


def setup(device: str) -> Dist:
    """Join torchrun's process group if launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend=backend)
    return Dist(rank=rank, world=world, local_rank=local, device=dev)


def teardown(d: Dist) -> None:
    if d.active and dist.is_initialized():
        dist.destroy_process_group()
