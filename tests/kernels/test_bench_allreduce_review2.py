"""Review of `bench allreduce --tp-sim`: a verify step past the memory is refused before its ranks start."""

from __future__ import annotations

import types

import pytest
import torch

from drafter_lab.cli import main as cli
from drafter_lab.kernels import bench_allreduce as bar

pytestmark = pytest.mark.skipif(not bar._ext.available(), reason=bar._ext.unavailable_reason() or "built")


@pytest.fixture
def no_ranks(monkeypatch):
    def ran(*_, **__):
        raise AssertionError("the ranks started")

    monkeypatch.setattr(bar, "_run", ran)
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 10**9)


def test_tp_sim_past_the_memory_is_refused_before_the_ranks(no_ranks, capsys, tmp_path):
    """Each rank printed its allocator's traceback (or the OOM killer ended it), then `benchmark ranks failed`."""
    sim = ["bench", "allreduce", "--tp-sim", "--backends", "cpu", "--json", str(tmp_path / "tp.json")]
    assert cli([*sim, "--tokens", "1", "8192"]) == 2
    # per rank: "none" and cpu each hold a 117 MB input, the step 5 more and 3 float32 copies (705 MB)
    assert capsys.readouterr().err == ("error: --tokens 8192 and --inner 32: 2 ranks simulating the verify step "
                                       "need 3.1 GB, more than the 1.0 GB of memory available\n")
    assert cli([*sim, "--inner", "100000"]) == 2  # two 2.9 GB float32 weights per backend, and one's draw
    assert capsys.readouterr().err.startswith("error: --tokens 8 and --inner 100000: 2 ranks simulating the verify "
                                              "step need 28.7 GB")
    with pytest.raises(AssertionError, match="the ranks started"):  # the defaults fit
        bar.main(sim[2:])


def test_tp_sim_past_a_gpus_memory_is_refused(no_ranks, monkeypatch):
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 10**12)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=10**9))
    args = types.SimpleNamespace(dtype="bfloat16", tokens=[8192], inner=32, backends=["gloo", "nccl"])
    with pytest.raises(bar.LabError, match=r"^--tokens 8192 and --inner 32: each rank simulating the verify step "
                                           r"on its GPU needs 1\.4 GB, more than its 1\.0 GB$"):
        bar.check_tp_sim(args, 2)
    bar.check_tp_sim(types.SimpleNamespace(**{**vars(args), "tokens": [8]}), 2)
