"""torchrun support: process group setup (gloo on CPU, NCCL on GPU) and count reductions.

Without torchrun's environment everything degrades to a single process and no-op reductions.
"""

from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import resolve_device


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
    """The device a run trains on: `resolve_device`'s, with a bare "cuda" taken as this rank's GPU:
    cuda:LOCAL_RANK, or the only one a rank sees (launchers that bind one GPU per rank through
    CUDA_VISIBLE_DEVICES, e.g. SLURM's --gpus-per-task=1, leave LOCAL_RANK as it is)."""
    dev = resolve_device(name)
    if dev.type != "cuda" or dev.index is not None:
        return dev
    return resolve_device("cuda:0" if torch.cuda.device_count() == 1 else f"cuda:{local_rank}")


def setup(device: str) -> Dist:
    """Join torchrun's process group if launched by torchrun. The group lives as long as the process:
    several runs in one (the probe's pilot arms, the study's) share it, as a second rendezvous on
    torchrun's store after a teardown can hang."""
    world, rank, local = _env_int("WORLD_SIZE", 1, 1), _env_int("RANK", 0, 0), _env_int("LOCAL_RANK", 0, 0)
    if rank >= world:  # RANK 1 alone: rank 1 of 1, an IndexError at the first step
        raise LabError(f"RANK {rank} is not below WORLD_SIZE {world}: launch with torchrun, or unset RANK and WORLD_SIZE")
    dev = pick_device(device, local)
    if _env_int("LOCAL_WORLD_SIZE", 1, 1) > 1 and dev.type == "cuda" and torch.cuda.device_count() > 1 \
            and resolve_device(device).index is not None:  # NCCL's "Duplicate GPU detected" traceback otherwise
        raise LabError(f"--device {device} puts every rank of this node on one GPU; pass --device cuda, and "
                       "each rank takes cuda:LOCAL_RANK")
    if world > 1 and not dist.is_initialized():
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.set_device(dev)
        # device_id binds NCCL to this rank's GPU: its barriers then use it, not a guess of GPU 0
        dist.init_process_group(backend="nccl" if cuda else "gloo", device_id=dev if cuda else None)
        atexit.register(_leave)
        global _joined
        _joined = True
    return Dist(rank=rank, world=world, local_rank=local, device=dev)


_joined = False  # setup() joined torchrun's group in this process


def _env_int(name: str, default: int, least: int) -> int:
    """An integer of torchrun's environment, at least `least`: a hand-set bad value is one line, not
    int()'s ValueError or, for WORLD_SIZE 0, a zero slice step at the first validation."""
    text = os.environ.get(name, str(default))
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise LabError(f"{name}={text!r} is not an integer >= {least}: launch with torchrun, or unset {name}")
    return value


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def end_process(code: int) -> None:
    """Exit now with `code` if this process joined torchrun's group and is still in it (else return):
    the exit handlers run, the group is left, and the interpreter is not finalized.

    DDP keeps gloo's group, and with it gloo's worker threads, alive past destroy_process_group. A worker
    that lets go of a finished collective's tensor once the interpreter is finalizing cannot take the GIL
    to free it, and the process aborts ("terminate called without an active exception"): its results
    are all written, yet torchrun reports the run FAILED."""
    if not (_joined and dist.is_initialized()):
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
