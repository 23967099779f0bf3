"""Mutation audit (review s76 h10) of train/distributed.py: which GPU a rank takes, the refusal of
every rank on one GPU, what joining the group binds and registers, the barrier, and the exit."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import distributed


def _gpus(monkeypatch, n: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("gpus, name, local_rank, want", [
    (2, "cuda", None, "cuda:0"),  # no LOCAL_RANK given: rank 0's GPU
    (2, "cuda", 1, "cuda:1"),
    (1, "cuda", 1, "cuda:0"),  # one GPU bound to each rank (CUDA_VISIBLE_DEVICES): the only one it sees
    (2, "cuda:1", 0, "cuda:1"),  # a GPU named by index is taken as named
    (2, "cpu", 1, "cpu"),
])
def test_the_device_a_rank_takes(monkeypatch, gpus, name, local_rank, want):
    _gpus(monkeypatch, gpus)
    args = (name,) if local_rank is None else (name, local_rank)
    assert distributed.pick_device(*args) == torch.device(want)


def _torchrun(monkeypatch, gpus: int, **env) -> list:
    """torchrun's environment and a group not joined yet; what setup() calls, in order."""
    _gpus(monkeypatch, gpus)
    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed, "_joined", False)
    monkeypatch.setattr(distributed.atexit, "register", lambda f: calls.append(("atexit", f)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: calls.append(("set_device", dev)))
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, device_id: calls.append(("init", backend, device_id)))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return calls


def test_a_cuda_rank_binds_its_gpu_then_joins_nccl_and_leaves_at_exit(monkeypatch):
    calls = _torchrun(monkeypatch, 2, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert distributed.setup("cuda").device == torch.device("cuda:1")
    gpu = torch.device("cuda:1")
    assert calls == [("set_device", gpu), ("init", "nccl", gpu), ("atexit", distributed._leave)]
    assert distributed._joined  # end_process ends this process


def test_a_cpu_rank_joins_gloo_without_a_gpu(monkeypatch):
    calls = _torchrun(monkeypatch, 2, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert distributed.setup("cpu").device == torch.device("cpu")
    assert calls == [("init", "gloo", None), ("atexit", distributed._leave)]
    assert distributed._joined


def test_every_rank_of_a_node_on_one_named_gpu_is_refused_before_joining(monkeypatch):
    calls = _torchrun(monkeypatch, 2, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    with pytest.raises(LabError, match=r"^--device cuda:0 puts every rank of this node on one GPU; pass --device cuda"):
        distributed.setup("cuda:0")
    assert calls == []


@pytest.mark.parametrize("env", [
    {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},  # two nodes of one rank each
    {},  # no torchrun
])
def test_one_rank_a_node_may_name_its_gpu(monkeypatch, env):
    """No other rank of its node shares the GPU it names."""
    _torchrun(monkeypatch, 2, **env)
    assert distributed.setup("cuda:1").device == torch.device("cuda:1")


def test_a_single_process_sums_without_a_group(monkeypatch):
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t: pytest.fail("an all-reduce without a group"))
    t = torch.arange(3.0)
    assert torch.equal(distributed.Dist(0, 1, 0, torch.device("cpu")).sum(t), torch.arange(3.0))


def test_ranks_wait_at_a_barrier_and_a_single_process_does_not(monkeypatch):
    waited = []
    monkeypatch.setattr(distributed.dist, "barrier", lambda: waited.append(True))
    distributed.Dist(0, 1, 0, torch.device("cpu")).barrier()
    assert waited == []
    distributed.Dist(1, 2, 1, torch.device("cpu")).barrier()
    assert waited == [True]


@pytest.mark.parametrize("initialized", [True, False])
def test_leaving_destroys_the_group_only_where_there_is_one(monkeypatch, initialized):
    destroyed = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: destroyed.append(True))
    distributed._leave()
    assert destroyed == ([True] if initialized else [])


class _Stream:
    def __init__(self, done: list, name: str):
        self.done, self.name = done, name

    def flush(self):
        self.done.append(self.name)


class _Exited(Exception):
    pass


def test_end_process_flushes_both_streams_before_it_exits(monkeypatch):
    """os._exit skips the interpreter's own flush: output still buffered (stdout into a pipe, a progress
    line on stderr without its newline) would be lost."""
    done = []
    monkeypatch.setattr(distributed, "_joined", True)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.atexit, "_run_exitfuncs", lambda: None)
    monkeypatch.setattr(distributed.sys, "stdout", _Stream(done, "stdout"))
    monkeypatch.setattr(distributed.sys, "stderr", _Stream(done, "stderr"))

    def exit_now(code):
        done.append(code)
        raise _Exited

    monkeypatch.setattr(distributed.os, "_exit", exit_now)
    with pytest.raises(_Exited):
        distributed.end_process(0)
    assert done == ["stdout", "stderr", 0]
