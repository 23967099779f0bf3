"""Mutation audit s77 (h3) of the all-reduce benchmark: its documented defaults, the memory it counts
before the ranks start (to the byte, at the boundary), the calls it times per size, and the latency
table it prints and writes. No rank is spawned: `_run` is faked where the table needs results."""

from __future__ import annotations

import argparse
import json
import types

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext
from drafter_lab.kernels import bench_allreduce as bar

built = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def test_the_parser_defaults_are_the_documented_ones():
    """The module's docstring and --help promise these: a changed default silently changes every table."""
    p = bar.build_parser()
    a = p.parse_args([])
    assert a.sizes == [1024 << k for k in range(11)]  # 1 KB .. 1 MB
    assert (a.iters, a.timeout, a.blocks, a.dtype) == (2000, 30.0, 16, "bfloat16")
    assert (a.tokens, a.layers, a.inner, a.sim_reps) == ([1, 2, 4, 8], 61, 32, 5)
    assert (a.ranks, a.backends, a.json, a.tp_sim, a.gpu_streams) == (None, None, None, False, False)
    assert p.description == "All-reduce benchmark: our shared-memory communicator against torch.distributed in the same run."


@built
@pytest.mark.parametrize("argv, ranks", [([], [2, 4]), (["--tp-sim"], [2])])
def test_the_default_ranks_are_two_and_four_or_the_simulators_two(argv, ranks, monkeypatch):
    seen = []
    monkeypatch.setattr(bar, "latency_table", seen.append)
    monkeypatch.setattr(bar, "tp_sim", seen.append)
    monkeypatch.setattr(bar, "refuse_unwritable", lambda *a: None)
    assert bar.main([*argv, "--backends", "cpu", "--sizes", "1024"]) == 0
    assert seen[0].ranks == ranks


@built
def test_the_smallest_values_each_check_takes_are_run(monkeypatch):
    """The lower bounds are inclusive: one rank, one call, a one-byte message (sent as one element), one
    token, layer, shard column and rep, one CTA, and a timeout under a second."""
    seen = []
    monkeypatch.setattr(bar, "latency_table", seen.append)
    monkeypatch.setattr(bar, "tp_sim", seen.append)
    monkeypatch.setattr(bar, "refuse_unwritable", lambda *a: None)
    ones = ["--backends", "cpu", "--ranks", "1", "--iters", "1", "--sizes", "1", "--timeout", "0.5", "--blocks", "1"]
    assert bar.main(ones) == 0
    assert bar.main([*ones, "--tp-sim", "--tokens", "1", "--layers", "1", "--inner", "1", "--sim-reps", "1"]) == 0
    assert [(a.ranks, a.iters, a.sizes, a.timeout) for a in seen] == [([1], 1, [2], 0.5)] * 2
    assert (seen[1].tokens, seen[1].layers, seen[1].inner, seen[1].sim_reps, seen[1].blocks) == ([1], 1, 1, 1, 1)


def _sizes_args(**kw):
    base = dict(sizes=[1 << 20, 4096], dtype="bfloat16", ranks=[2, 4], backends=["cpu"], gpu_streams=False)
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("dtype, per_rank", [("bfloat16", 3 << 20), ("float32", 2 << 20)])
def test_latency_sizes_fit_the_host_to_the_byte(monkeypatch, dtype, per_rank):
    """Each of the 4 ranks holds the largest message (1 MB) and its float32 draw (2 MB in bfloat16, 1 MB
    in float32): exactly that much memory is enough, one byte less is refused."""
    have = [4 * per_rank]
    monkeypatch.setattr(bar, "host_available_bytes", lambda: have[0])
    bar.check_sizes(_sizes_args(dtype=dtype))
    have[0] -= 1
    with pytest.raises(LabError, match=r"^--sizes 1048576: 4 ranks drawing the message in float32 need"):
        bar.check_sizes(_sizes_args(dtype=dtype))


@pytest.mark.parametrize("streams, ranks, per_gpu", [(False, [4, 2], 1), (True, [3, 2], 2)])
def test_gpu_sizes_fit_a_gpu_to_the_byte(monkeypatch, streams, ranks, per_gpu):
    """A GPU holds one rank's message and draw (3 MB for 1 MB of bfloat16): as processes, a world with
    more ranks than GPUs runs without the GPU backends; as streams, 3 ranks on 2 GPUs put two on one.
    The host's memory is not counted for GPU-only backends."""
    total = [per_gpu * (3 << 20)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=total[0]))
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 0)
    args = _sizes_args(ranks=ranks, backends=["nccl", "cuda-ipc"], gpu_streams=streams)
    bar.check_sizes(args)
    total[0] -= 1
    with pytest.raises(LabError, match=r"^--sizes 1048576: the ranks on a GPU drawing the message in float32 need"):
        bar.check_sizes(args)


def test_without_cuda_no_gpus_memory_is_counted(monkeypatch):
    """GPU backends named on a host where CUDA is unavailable (a count reported anyway) are not sized
    against a GPU: _for_world drops them later, with its own message."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: pytest.fail("read a GPU's memory"))
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 1 << 40)
    bar.check_sizes(_sizes_args(backends=["cpu", "nccl"]))


def test_the_simulators_memory_is_counted_to_the_byte(monkeypatch):
    """float16, --tokens 1 2, --inner 5, per rank: a 28,672-byte message, 286,720 bytes of float32 weights,
    and a step of 5 messages + 3 float32 [2, 7168] temporaries + the weights' float32 draw (half of them)
    = 458,752. The host holds "none", cpu and gloo (3 x (message + weights) + step = 1,404,928, for 2 ranks
    2,809,856); each GPU one backend's (774,144). Exactly that fits, one byte less is refused."""
    args = types.SimpleNamespace(dtype="float16", tokens=[1, 2], inner=5, backends=["cpu", "gloo", "nccl"])
    host, gpu = [2_809_856], [774_144]
    monkeypatch.setattr(bar, "host_available_bytes", lambda: host[0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=gpu[0]))
    bar.check_tp_sim(args, 2)
    gpu[0] -= 1
    with pytest.raises(LabError, match=r"^--tokens 2 and --inner 5: each rank simulating the verify step on its GPU"):
        bar.check_tp_sim(args, 2)
    host[0] -= 1
    with pytest.raises(LabError, match=r"^--tokens 2 and --inner 5: 2 ranks simulating the verify step need"):
        bar.check_tp_sim(args, 2)


def test_calls_per_size_shrink_above_64_kb_to_a_floor_of_50():
    """--iters up to 64 KB, then as many calls as move the same bytes, but never under 50 (nor above --iters)."""
    assert [bar._iters(n, 2000) for n in (64 << 10, 128 << 10, 1 << 20, 1 << 30)] == [2000, 1000, 125, 50]
    assert bar._iters(1 << 20, 10) == 10


def _fake_run(calls):
    def run(worker, world, args, total, what):
        calls.append((worker, world, args.backends, total, what))
        results = {b: {1024: 2.0 * world, 3 << 20: 40.0} for b in args.backends}
        if "gloo" in results:
            results["gloo"] = {1024: 5.0 * world, 3 << 20: 120.0}
        return results, {b: {1024: "1-shot", 3 << 20: "3x 2-shot"} for b in args.backends if b in bar.OURS}
    return run


@built
def test_the_latency_table_prints_each_worlds_times_algorithms_and_ratios(monkeypatch, capsys, tmp_path):
    calls = []
    monkeypatch.setattr(bar, "_run", _fake_run(calls))
    out = tmp_path / "lat.json"
    args = argparse.Namespace(ranks=[2, 3], backends=["cpu", "gloo"], sizes=[1024, 3 << 20], dtype="float16",
                              iters=9, json=str(out))
    got = bar.latency_table(args)
    assert [c[:4] for c in calls] == [(bar._latency_worker, w, ["cpu", "gloo"], 2) for w in (2, 3)]
    assert got == {w: {"cpu": {1024: 2.0 * w, 3 << 20: 40.0}, "gloo": {1024: 5.0 * w, 3 << 20: 120.0}} for w in (2, 3)}
    text = capsys.readouterr().out
    assert f"float16, 3 ranks on this host ({_ext.cpu_isa()} tiles): median us per call" in text
    lines = [line.split() for line in text.splitlines()]
    assert lines.count(["size", "cpu", "gloo", "cpu", "algo", "gloo/cpu"]) == 2
    rows = [cells for cells in lines if cells[1:2] in (["KB"], ["MB"])]
    assert rows == [["1", "KB", "4.00", "10.00", "1-shot", "2.5x"], ["3", "MB", "40.00", "120.00", "3x", "2-shot", "3.0x"],
                    ["1", "KB", "6.00", "15.00", "1-shot", "2.5x"], ["3", "MB", "40.00", "120.00", "3x", "2-shot", "3.0x"]]
    report = json.loads(out.read_text())
    assert report["algos"]["3 ranks, cpu"] == {"1024": "1-shot", str(3 << 20): "3x 2-shot"}
    assert json.loads(out.with_name("lat.costmodel-gloo-3ranks.json").read_text()) == {
        "allreduce_us": {"1024": 15.0, str(3 << 20): 120.0}}


@built
def test_a_baseline_only_table_has_no_tiles_algorithms_or_ratios_and_writes_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(bar, "_run", _fake_run([]))
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(ranks=[2], backends=["gloo"], sizes=[1024], dtype="bfloat16", iters=9, json=None)
    bar.latency_table(args)
    text = capsys.readouterr().out
    assert "bfloat16, 2 ranks on this host: median us per call" in text
    assert [line.split() for line in text.splitlines()][-2:] == [["size", "gloo"], ["1", "KB", "10.00"]]
    assert list(tmp_path.iterdir()) == []


class _Queue(list):
    put = list.append


@built
def test_a_simulated_step_is_timed_in_milliseconds_without_its_warm_up(tmp_path, monkeypatch):
    """Rank 0 of 1 in this process, its clock faked: the warm-up steps (none's, then cpu's) read it once
    and are not timed, then none and cpu take 2 and 4 ms, 2 and 4 ms, 3 and 6 ms: each reports its median in ms."""
    timed_s = [0.002, 0.004, 0.002, 0.004, 0.003, 0.006]
    readings = iter([0.0, 1.0] + [r for i, d in enumerate(timed_s, 2) for r in (10.0 * i, 10.0 * i + d)])
    monkeypatch.setattr(bar, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    monkeypatch.setattr(bar, "_median_us", lambda group, backend, fn, iters, warmup: 7.0)
    monkeypatch.setattr(bar, "_verify_step", lambda *a: None)
    args = argparse.Namespace(backends=["cpu"], tokens=[1], dtype="bfloat16", iters=5, inner=4, layers=3,
                              sim_reps=3, timeout=30.0)
    queue, threads = _Queue(), torch.get_num_threads()
    try:
        bar._tp_sim_worker(0, 1, str(tmp_path / "store"), args, queue)
    finally:
        torch.set_num_threads(threads)
    (_, ar, vm) = queue[-1]
    assert ar == {"cpu": {bar.HIDDEN * 2: 7.0}}
    assert vm == {"none": {1: pytest.approx(2.0)}, "cpu": {1: pytest.approx(4.0)}}



@built
@pytest.mark.parametrize("worker", [bar._latency_worker, bar._tp_sim_worker], ids=lambda w: w.__name__)
def test_a_rank_times_on_one_thread(tmp_path, monkeypatch, worker):
    """Ranks share this host's cores: each sets torch to one thread before it times anything."""
    threads_seen = []
    monkeypatch.setattr(bar, "_median_us", lambda *a: threads_seen.append(torch.get_num_threads()) or 1.0)
    monkeypatch.setattr(bar, "_verify_step", lambda *a: None)
    args = argparse.Namespace(backends=["cpu"], sizes=[1024], tokens=[1], dtype="bfloat16", iters=5, inner=4,
                              layers=1, sim_reps=1, timeout=30.0)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        worker(0, 1, str(tmp_path / "store"), args, _Queue())
    finally:
        torch.set_num_threads(threads)
    assert threads_seen == [1]


@built
def test_a_ranks_group_routes_each_backend_to_its_own_all_reduce(tmp_path, monkeypatch):
    """Ours goes to its communicator, gloo to the default group, nccl to the nccl group; only a GPU
    backend waits for its device, GPU rank % GPUs (rank 3 on 2 GPUs: GPU 1); the max over one rank is its values."""
    calls = []
    group = bar._Group(0, 1, str(tmp_path / "store"), ["cpu", "gloo"], 30.0)
    try:
        group.nccl = "the nccl group"  # as a GPU run's would have
        monkeypatch.setattr(group.comms["cpu"], "all_reduce", lambda t: calls.append(("cpu", t)))
        monkeypatch.setattr(bar.dist, "all_reduce", lambda t, group=None: calls.append((group, t)))
        t = torch.ones(4)
        for b in ("cpu", "gloo", "nccl"):
            group.all_reduce_fn(b, t)()
        assert [(c, x is t) for c, x in calls] == [("cpu", True), (None, True), ("the nccl group", True)]
        monkeypatch.undo()
        assert group.max_over_ranks([1.5, 2.0]) == [1.5, 2.0]
        synced = []
        monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        for b in ("cpu", "gloo", "none", "cuda-ipc"):
            group.sync(b)
        group.rank = 3
        group.sync("cuda-host")
        assert synced == [torch.device("cuda", 0), torch.device("cuda", 1)]
    finally:
        group.close()
    with pytest.raises(bar.LabError, match="this communicator is closed"):  # its segment unmapped with the group
        group.comms["cpu"].all_reduce(torch.ones(4))


@built
def test_the_simulator_runs_the_backends_its_world_can_and_heads_its_table(monkeypatch, capsys, tmp_path):
    """Without a GPU nccl is dropped before the ranks start (as the latency table drops it), and the
    printed table is headed by the step's columns, then the all-reduce's."""
    calls = []

    def fake_run(worker, world, args, total, what):
        calls.append(args.backends)
        return {"cpu": {14336: 9.0}}, {b: {1: 1.0} for b in ("none", "cpu")}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bar, "_run", fake_run)
    assert bar.main(["--tp-sim", "--backends", "cpu", "nccl", "--tokens", "1", "--json", str(tmp_path / "sim.json")]) == 0
    assert calls == [["cpu"]]
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["tokens", "bytes", "none", "ms", "cpu", "ms", "all-reduce", "us:", "cpu"] in lines


@built
def test_the_simulator_report_names_gpu_0_and_is_what_it_wrote(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"GPU {d}")
    monkeypatch.setattr(bar, "_run", lambda *a: ({"cpu": {14336: 9.0}}, {b: {1: 1.0} for b in ("none", "cpu")}))
    out = tmp_path / "sim.json"
    args = bar.build_parser().parse_args(["--ranks", "2", "--backends", "cpu", "--tokens", "1", "--json", str(out)])
    report = bar.tp_sim(args)
    assert report["meta"]["cuda"] == "GPU 0"
    assert report == json.loads(out.read_text())


def test_a_build_without_the_extension_is_refused_with_its_reason(monkeypatch):
    monkeypatch.setattr(bar._ext, "available", lambda: False)
    monkeypatch.setattr(bar._ext, "unavailable_reason", lambda: "drafter_lab._C is not built")
    monkeypatch.setattr(bar, "latency_table", lambda args: pytest.fail("ran"))
    with pytest.raises(LabError, match="^drafter_lab._C is not built$"):
        bar.main(["--backends", "cpu", "--ranks", "2"])


@built
def test_gpu_streams_sizes_are_checked_before_the_streams_run(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=1 << 20))
    monkeypatch.setattr(bar, "gpu_streams", lambda args: pytest.fail("ran"))
    with pytest.raises(LabError, match="^--sizes 1048576: the ranks on a GPU drawing the message in float32 need"):
        bar.main(["--gpu-streams", "--backends", "cuda-ipc", "--sizes", str(1 << 20), "--json", str(tmp_path / "a.json")])


def test_fastest_tables_sort_by_size_not_by_time():
    assert list(bar.fastest_tables({"2 ranks, cpu 1-shot": {"4096": 3.0, "1024": 5.0}})["cpu-2ranks"]) == ["1024", "4096"]


def test_gpu_streams_without_a_cuda_backend_named_is_refused(monkeypatch):
    """A CUDA build and a GPU are not enough: the streams time only the CUDA backends."""
    monkeypatch.setattr(bar, "_cuda_backends", lambda: ["cuda-host", "cuda-ipc"])
    with pytest.raises(LabError, match="^--gpu-streams needs the CUDA backends"):
        bar.gpu_streams(argparse.Namespace(backends=["cpu", "gloo"]))
