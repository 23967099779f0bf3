"""Review s65 (mutation audit) of the all-reduce benchmark's pure parts: the size labels and "best" column
it prints, the algorithm it names for a size, which backends a world keeps, the memory it counts before
the ranks start, and the segments it removes after them. No rank is spawned here."""

from __future__ import annotations

import io
import json
import os
import types
from pathlib import Path

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext
from drafter_lab.kernels import bench_allreduce as bar


def test_size_labels_are_exact():
    """A label names the bytes sent: MB only for whole megabytes, else KB only for whole kilobytes."""
    got = [bar._fmt_size(n) for n in (2, 1000, 1024, 3 << 10, 1 << 20, 3 << 20, (1 << 20) + (512 << 10))]
    assert got == ["2 B", "1000 B", "1 KB", "3 KB", "1 MB", "3 MB", "1536 KB"]


def test_best_column_is_the_fastest_algorithm_of_that_backend_only():
    cols = {"cuda-ipc 1-shot": {1024: 6.9, 4096: 7.5}, "cuda-ipc 2-shot": {1024: 10.0, 4096: 7.1},
            "cuda-ipc LL": {1024: 5.1},  # LL only up to its capacity: no 4096
            "cuda-host 1-shot": {1024: 1.0, 4096: 1.0}}
    assert bar._best(cols, "cuda-ipc", 1024) == "5.10 (LL)"
    assert bar._best(cols, "cuda-ipc", 4096) == "7.10 (2-shot)"
    assert bar._best(cols, "cuda-host", 4096) == "1.00 (1-shot)"


def test_fastest_tables_list_sizes_in_numeric_order():
    """The flat cost-model files list sizes as numbers ascend, not as strings sort."""
    tables = bar.fastest_tables({"2 ranks, cpu 1-shot": {"1048576": 3.0, "57344": 2.0, "1024": 1.0}})
    assert list(tables["cpu-2ranks"]) == ["1024", "57344", "1048576"]


def _comm(**kw):
    base = dict(capacity=1 << 20, ll_max_bytes=0, ll_capacity=0, one_shot_max_bytes=1 << 20)
    return types.SimpleNamespace(**{**base, **kw})


def test_algorithm_names_honour_the_ll_area():
    """LL is named up to the smaller of its threshold and its area (the cpu backend's area is 0)."""
    ll = _comm(ll_max_bytes=64 << 10, ll_capacity=16 << 10, one_shot_max_bytes=256 << 10)
    assert [bar._algo_name(ll, n) for n in (16 << 10, (16 << 10) + 2, 256 << 10, (256 << 10) + 2)] == [
        "LL", "1-shot", "1-shot", "2-shot"]
    assert bar._algo_name(_comm(ll_max_bytes=1 << 20), 1024) == "1-shot"


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=10**9))


def test_a_world_keeps_the_gpu_backends_while_each_rank_has_a_gpu(two_gpus):
    args = types.SimpleNamespace(backends=["cpu", "nccl", "cuda-ipc"])
    assert bar._for_world(args, 2).backends == ["cpu", "nccl", "cuda-ipc"]
    assert bar._for_world(args, 3).backends == ["cpu"]


def test_gpu_streams_sizes_count_the_streams_that_share_a_gpu(two_gpus, monkeypatch):
    """4 ranks as streams on 2 GPUs hold two messages per GPU; the host's memory is not theirs."""
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 0)
    # each rank: the 200 MB bfloat16 message and its 400 MB float32 draw
    args = types.SimpleNamespace(sizes=[200_000_000], dtype="bfloat16", ranks=[2, 4], backends=["cpu", "cuda-ipc"],
                                 gpu_streams=True)
    with pytest.raises(LabError, match=r"^--sizes 200000000: the ranks on a GPU drawing the message in float32 "
                                       r"need 1\.2 GB, more than its 1\.0 GB$"):
        bar.check_sizes(args)
    args.ranks = [2]  # one stream per GPU: 600 MB fits
    bar.check_sizes(args)


def test_gpu_streams_refuses_an_unwritable_report_by_the_name_it_writes(tmp_path, monkeypatch):
    """--gpu-streams writes allreduce_gpu_streams_<blocks>ctas.json beside --json, not --json itself."""
    monkeypatch.setattr(bar, "gpu_streams", lambda args: pytest.fail("timed before refusing its output"))
    monkeypatch.setattr(bar, "check_sizes", lambda args: None)
    (tmp_path / "allreduce_gpu_streams_8ctas.json").mkdir()
    argv = ["--gpu-streams", "--backends", "cuda-ipc", "--blocks", "8", "--json", str(tmp_path / "tp.json")]
    with pytest.raises(LabError, match="allreduce_gpu_streams_8ctas.json"):
        bar.main(argv)


def test_host_memory_is_read_from_meminfo_in_bytes(monkeypatch):
    meminfo = "MemTotal:       8000000 kB\nMemFree:         100 kB\nMemAvailable:    2048 kB\n"
    monkeypatch.setattr(bar, "open", lambda *a, **k: io.StringIO(meminfo), raising=False)
    assert bar.host_available_bytes() == 2048 * 1024

    def no_procfs(*a, **k):
        raise OSError("no /proc")

    monkeypatch.setattr(bar, "open", no_procfs, raising=False)
    assert bar.host_available_bytes() == os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
def test_only_the_dead_ranks_segments_are_removed():
    """Another run's segments (a live communicator's) must survive this run's clean-up."""
    dead, alive = 2**31 - 7, 2**31 - 9  # pids no process here has
    mine = Path(f"/dev/shm/drafter_lab_ar.{dead}.s65test")
    theirs = Path(f"/dev/shm/drafter_lab_ar.{alive}.s65test")
    try:
        mine.write_bytes(b"")
        theirs.write_bytes(b"")
        bar._unlink_segments({dead})
        assert not mine.exists() and theirs.exists()
    finally:
        for p in (mine, theirs):
            p.unlink(missing_ok=True)


@pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")
def test_the_simulated_verify_step_is_the_same_step_on_every_backend(tmp_path):
    """The simulator compares like with like: at one rank (an all-reduce is the identity) our fused
    all-reduce + residual + RMSNorm, the baseline's all-reduce then torch ops, and "none" all compute
    x <- RMSNorm(residual <- residual + GEMV pair(x)) twice per layer."""
    group = bar._Group(0, 1, str(tmp_path / "store"), ["cpu", "gloo"], 30.0)
    try:
        gen = torch.Generator().manual_seed(0)
        w_in = torch.randn(bar.HIDDEN, 8, generator=gen) / bar.HIDDEN**0.5
        w_out = torch.randn(8, bar.HIDDEN, generator=gen) / 8**0.5
        norm_w = (0.5 + torch.rand(bar.HIDDEN, generator=gen)).to(torch.bfloat16)
        x0 = torch.randn(2, bar.HIDDEN, generator=gen).to(torch.bfloat16)
        got = {b: bar._verify_step(group, b, x0.clone(), x0.clone(), (w_in, w_out), norm_w, 2)
               for b in ("none", "cpu", "gloo")}
    finally:
        group.close()
    x, residual = x0.float(), x0.float()
    for _ in range(4):
        residual = residual + (x @ w_in) @ w_out
        x = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w.float()
    for b, out in got.items():
        assert torch.allclose(out.float(), x, rtol=0.05, atol=0.05), b


@pytest.mark.parametrize("argv, message", [
    (["--gpu-streams", "--blocks", "0"], "--blocks must be at least 1, got 0"),  # a kernel launch of no CTAs
    (["--tp-sim", "--layers", "0"], "--layers must be at least 1, got 0"),  # a step with no all-reduce
    (["--tp-sim", "--inner", "-3"], "--inner must be at least 1, got -3"),
])
def test_counts_the_other_tests_do_not_name_are_refused(argv, message, monkeypatch):
    monkeypatch.setattr(bar, "tp_sim", lambda args: pytest.fail("ran"))
    monkeypatch.setattr(bar, "gpu_streams", lambda args: pytest.fail("ran"))
    with pytest.raises(LabError) as e:
        bar.main(["--backends", "cpu", *argv])
    assert str(e.value) == message


def test_latency_json_records_the_runs_settings(tmp_path):
    """The latency table's JSON without spawning ranks: its columns, algorithms, settings and flat files."""
    out = tmp_path / "lat.json"
    args = types.SimpleNamespace(json=str(out), dtype="float16", iters=77)
    bar._write_latency_json(args, {2: {"cpu": {1024: 3.0, 4096: 5.0}}, 4: {"cpu": {1024: 4.0, 4096: 6.0}}},
                            {2: {"cpu": {1024: "1-shot", 4096: "2-shot"}}, 4: {"cpu": {1024: "1-shot", 4096: "1-shot"}}})
    report = json.loads(out.read_text())
    assert report["allreduce_us"] == {"2 ranks, cpu": {"1024": 3.0, "4096": 5.0}, "4 ranks, cpu": {"1024": 4.0, "4096": 6.0}}
    assert report["algos"]["2 ranks, cpu"] == {"1024": "1-shot", "4096": "2-shot"}
    assert (report["meta"]["dtype"], report["meta"]["ranks"], report["meta"]["iters"]) == ("float16", [2, 4], 77)
    assert json.loads((tmp_path / "lat.costmodel-cpu-4ranks.json").read_text()) == {"allreduce_us": {"1024": 4.0, "4096": 6.0}}
