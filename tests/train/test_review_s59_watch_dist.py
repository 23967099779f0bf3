"""distributed.setup: torchrun's environment set by hand to bad values is one line, before any work."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train import distributed


@pytest.mark.parametrize("env, problem", [
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE='x' is not an integer >= 1"),
    ({"WORLD_SIZE": ""}, "WORLD_SIZE='' is not an integer >= 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),  # was a zero slice step at validation
    ({"RANK": "-1"}, "RANK='-1' is not an integer >= 0"),
    ({"LOCAL_RANK": "a"}, "LOCAL_RANK='a' is not an integer >= 0"),
    ({"LOCAL_WORLD_SIZE": "two"}, "LOCAL_WORLD_SIZE='two' is not an integer >= 1"),
    ({"RANK": "1"}, "RANK 1 is not below WORLD_SIZE 1"),  # was an IndexError at the first step, nothing written
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK 3 is not below WORLD_SIZE 2"),
])
def test_bad_torchrun_environment_is_one_line(monkeypatch, env, problem):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: pytest.fail("joined a group"))
    with pytest.raises(LabError, match=f"^{problem}"):
        distributed.setup("cpu")


def test_a_single_process_without_torchrun_is_rank_0_of_1(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    d = distributed.setup("cpu")
    assert (d.rank, d.world, d.local_rank, d.main, d.active) == (0, 1, 0, True, False)
