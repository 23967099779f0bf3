"""Mutation audit (review s65): torchrun setup on one GPU a rank and in a group already joined, the rank
that writes, and a train state's RNGs and damage."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train import distributed, state


def _torchrun(monkeypatch, gpus: int, initialized: bool, **env):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: initialized)
    monkeypatch.setattr(distributed, "_joined", False)
    monkeypatch.setattr(distributed.atexit, "register", lambda f: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: None)
    joined = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, device_id: joined.append(backend))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return joined


def test_only_rank_0_is_the_writer():
    ranks = [distributed.Dist(rank=r, world=3, local_rank=r, device=torch.device("cpu")) for r in range(3)]
    assert [d.main for d in ranks] == [True, False, False]


def test_cuda_0_is_fine_where_each_rank_sees_one_gpu(monkeypatch):
    """Launchers that bind one GPU a rank (CUDA_VISIBLE_DEVICES) leave every rank's GPU at cuda:0: not the
    'every rank on one GPU' refusal meant for a node whose ranks all see all its GPUs."""
    joined = _torchrun(monkeypatch, 1, False, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert distributed.setup("cuda:0").device == torch.device("cuda:0")
    assert joined == ["nccl"]


def test_a_second_run_in_a_process_keeps_the_group_and_the_local_rank(monkeypatch):
    """Rank 3 of 4, the second of its node: cuda:LOCAL_RANK, not cuda:RANK; a group already joined (the
    probe's next arm) is not joined again."""
    joined = _torchrun(monkeypatch, 2, True, WORLD_SIZE="4", RANK="3", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    d = distributed.setup("cuda")
    assert (d.rank, d.world, d.local_rank, d.device) == (3, 4, 1, torch.device("cuda:1"))
    assert joined == []


def test_a_damaged_train_state_is_one_line_naming_it(tmp_path):
    path = state.state_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(LabError, match="train state is unreadable") as e:
        state.load(tmp_path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_train_state_names_the_run(tmp_path):
    with pytest.raises(LabError, match="nothing to resume: train_state/state.pt is missing") as e:
        state.load(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_the_saved_rngs_replay_their_draws():
    """Python's, numpy's and torch's generators all resume where the state left them."""
    saved = state.rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    state.set_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first


class _Exited(Exception):
    pass


def _exit_recorder(monkeypatch, joined: bool):
    done = []
    monkeypatch.setattr(distributed, "_joined", joined)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.atexit, "_run_exitfuncs", lambda: done.append("exit handlers"))

    def exit_now(code):
        done.append(code)
        raise _Exited

    monkeypatch.setattr(distributed.os, "_exit", exit_now)
    return done


def test_end_process_runs_the_exit_handlers_then_exits_with_the_code(monkeypatch):
    done = _exit_recorder(monkeypatch, joined=True)
    with pytest.raises(_Exited):
        distributed.end_process(3)
    assert done == ["exit handlers", 3]


def test_end_process_returns_where_another_part_joined_the_group(monkeypatch):
    """A group this process did not join through setup() (a benchmark's own) is not ended for it."""
    done = _exit_recorder(monkeypatch, joined=False)
    distributed.end_process(0)
    assert done == []


def test_a_sum_over_ranks_leaves_its_input_and_a_single_process_needs_no_group(monkeypatch):
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda t: t.mul_(2))  # two ranks holding the same
    monkeypatch.setattr(distributed.dist, "barrier", lambda: pytest.fail("a barrier without a group"))
    t = torch.ones(3)
    assert torch.equal(distributed.Dist(0, 2, 0, torch.device("cpu")).sum(t), torch.full((3,), 2.0))
    assert torch.equal(t, torch.ones(3))
    distributed.Dist(0, 1, 0, torch.device("cpu")).barrier()
