"""Mutation audit s78 (h6) of the all-reduce benchmark: the backends it offers, where each rank's
tensors live, and what a rank times and reports. Ranks run as rank 0 of 1 in this process (spawned
ranks import the installed package, so only in-process runs test this file's code)."""

from __future__ import annotations

import argparse
import types

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext
from drafter_lab.kernels import bench_allreduce as bar

built = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


def _cuda(monkeypatch, available: bool, count: int, with_cuda: bool = True, built_ext: bool = True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(bar._ext, "available", lambda: built_ext)
    monkeypatch.setattr(bar._ext, "load", lambda: types.SimpleNamespace(allreduce=types.SimpleNamespace(with_cuda=with_cuda)))


@pytest.mark.parametrize("available, with_cuda, built_ext", [(False, True, True), (True, False, True), (True, True, False)])
def test_the_cuda_backends_need_a_gpu_a_built_extension_and_its_cuda(monkeypatch, available, with_cuda, built_ext):
    _cuda(monkeypatch, available, 1, with_cuda, built_ext)
    assert bar._cuda_backends() == []
    assert bar.default_backends() == (["cpu", "gloo", "nccl"] if available else ["cpu", "gloo"])


def test_with_all_three_the_cuda_backends_run_by_default_before_nccl(monkeypatch):
    _cuda(monkeypatch, True, 1)
    assert bar._cuda_backends() == ["cuda-host", "cuda-ipc"]
    assert bar.default_backends() == ["cpu", "gloo", "cuda-host", "cuda-ipc", "nccl"]


@pytest.mark.parametrize("world", [1, 2])
def test_gpus_counted_without_cuda_do_not_keep_the_gpu_backends(monkeypatch, world):
    """A device count reported while CUDA is unavailable is no GPU: even one rank runs only cpu."""
    _cuda(monkeypatch, False, 2)
    assert bar._for_world(argparse.Namespace(backends=["cpu", "nccl"]), world).backends == ["cpu"]


@pytest.mark.parametrize("backend, rank, device", [
    ("cpu", 3, "cpu"), ("gloo", 0, "cpu"), ("none", 5, "cpu"),
    ("cuda-ipc", 3, "cuda:1"), ("nccl", 4, "cuda:0"), ("cuda-host", 1, "cuda:1")])
def test_a_rank_holds_its_tensors_on_the_host_or_on_gpu_rank_mod_gpus(monkeypatch, backend, rank, device):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert bar._device(backend, rank) == torch.device(device)


def test_gb_shows_small_needs_in_the_unit_they_fill():
    """A 12 KB need read "need 0.0 GB, more than the 0.0 GB"."""
    assert [bar._gb(n) for n in (28_700_000_000, 10**9, 999_999_999, 1_500_000, 12_288, 1000, 999, 0)] == [
        "28.7 GB", "1.0 GB", "1000.0 MB", "1.5 MB", "12.3 KB", "1.0 KB", "999 bytes", "0 bytes"]


def test_a_small_need_past_the_memory_names_both_amounts(monkeypatch):
    monkeypatch.setattr(bar, "host_available_bytes", lambda: 10_000)
    args = argparse.Namespace(sizes=[1024], dtype="bfloat16", ranks=[4], backends=["cpu"], gpu_streams=False)
    with pytest.raises(LabError) as e:  # 4 ranks x (1 KB + its 2 KB float32 draw)
        bar.check_sizes(args)
    assert str(e.value) == ("--sizes 1024: 4 ranks drawing the message in float32 need 12.3 KB, "
                            "more than the 10.0 KB of memory available")


def test_gpu_streams_refusals_name_what_is_missing(monkeypatch):
    """Without the CUDA backends the build or the GPU is missing; with them, --backends did not name one."""
    monkeypatch.setattr(bar, "_cuda_backends", lambda: [])
    with pytest.raises(LabError) as e:
        bar.gpu_streams(argparse.Namespace(backends=["cuda-ipc"]))
    assert str(e.value) == "--gpu-streams needs the CUDA backends: a CUDA build of drafter_lab._C and a visible GPU"
    monkeypatch.setattr(bar, "_cuda_backends", lambda: ["cuda-host", "cuda-ipc"])
    with pytest.raises(LabError) as e:
        bar.gpu_streams(argparse.Namespace(backends=["cpu", "gloo"]))
    assert str(e.value) == "--gpu-streams needs the CUDA backends: --backends cpu gloo names neither cuda-host nor cuda-ipc"


def test_a_world_that_drops_backends_says_which_and_one_that_drops_all_is_refused(monkeypatch):
    logged = []
    monkeypatch.setattr(bar, "log", logged.append)
    _cuda(monkeypatch, True, 1)
    args = argparse.Namespace(backends=["nccl", "cpu", "cuda-ipc"], iters=7)
    got = bar._for_world(args, 2)
    assert (vars(got), args.backends) == ({"backends": ["cpu"], "iters": 7}, ["nccl", "cpu", "cuda-ipc"])
    assert logged == ["2 ranks: skipping cuda-ipc, nccl (1 GPU(s) visible)"]
    assert bar._for_world(args, 1).backends == args.backends and len(logged) == 1
    with pytest.raises(LabError) as e:
        bar._for_world(argparse.Namespace(backends=["nccl", "cuda-host"]), 3)
    assert str(e.value) == "3 ranks: none of nccl, cuda-host can run here (1 GPU(s) visible)"


class _Queue(list):
    put = list.append


class _FakeGroup:
    """A rank's group without peers (the max over ranks is its own values); `log` records its calls."""

    log: list = []

    def __init__(self, rank, world, store_path, backends, timeout_s):
        self.comms, self.nccl = {}, "the nccl group"

    def all_reduce_fn(self, backend, t):
        self.log.append((backend, t.numel(), t.dtype))
        return lambda: None

    def sync(self, backend):
        self.log.append(("sync", backend))

    def max_over_ranks(self, values):
        return values

    def close(self):
        self.log.append("close")


@pytest.fixture
def fake_group(monkeypatch):
    monkeypatch.setattr(bar, "_Group", _FakeGroup)
    log = []
    monkeypatch.setattr(_FakeGroup, "log", log)
    monkeypatch.setattr(bar.dist, "barrier", lambda: log.append("barrier"))
    threads = torch.get_num_threads()
    yield _FakeGroup.log
    torch.set_num_threads(threads)


def _args(**kw):
    return argparse.Namespace(**{**dict(backends=["gloo"], sizes=[1024], tokens=[1], dtype="bfloat16", iters=5,
                                        inner=4, layers=1, sim_reps=1, timeout=30.0), **kw})


@pytest.mark.parametrize("worker", [bar._latency_worker, bar._tp_sim_worker], ids=lambda w: w.__name__)
def test_only_rank_0_reports_and_every_rank_closes_its_group(fake_group, monkeypatch, worker):
    """Every rank times, but one message per size and one result reach the parent, from rank 0."""
    monkeypatch.setattr(bar, "_median_us", lambda *a: 1.0)
    monkeypatch.setattr(bar, "_verify_step", lambda *a: None)
    queues = [_Queue(), _Queue()]
    for rank, queue in enumerate(queues):
        worker(rank, 2, "unused", _args(), queue)
    assert [m[0] for m in queues[0]] == ["progress", "done"] and queues[1] == []
    assert fake_group.count("close") == 2 and fake_group[-1] == "close"


def test_a_simulator_rank_times_messages_of_its_tokens_and_draws_scaled_weights(fake_group, monkeypatch):
    """Each backend's all-reduce is timed on [tokens x hidden] of the dtype after 20 warm-up calls; the
    GEMV weights are drawn at 1/sqrt(fan-in), so the step's values keep their scale."""
    timed, weights = [], []
    monkeypatch.setattr(bar, "_median_us", lambda group, b, fn, iters, warmup: timed.append((b, iters, warmup)) or 1.0)
    monkeypatch.setattr(bar, "_verify_step", lambda group, b, x, residual, w, norm_w, layers: weights.append(w))
    bar._tp_sim_worker(0, 1, "unused", _args(backends=["cpu", "gloo"], tokens=[3], dtype="float16", inner=64, iters=9),
                       _Queue())
    assert fake_group[:2] == [(b, 3 * bar.HIDDEN, torch.float16) for b in ("cpu", "gloo")]
    assert timed == [("cpu", 9, 20), ("gloo", 9, 20)]
    w_in, w_out = weights[0]
    assert (w_in.shape, w_out.shape) == ((bar.HIDDEN, 64), (64, bar.HIDDEN))
    assert w_in.std().item() == pytest.approx(bar.HIDDEN**-0.5, rel=0.05)
    assert w_out.std().item() == pytest.approx(64**-0.5, rel=0.05)


def test_each_simulated_step_is_timed_from_synced_ranks_to_its_synced_device(fake_group, monkeypatch):
    """Before each step every rank waits for its device and meets the others, and the clock stops after
    the step's device work: on a GPU the launches return at once."""
    monkeypatch.setattr(bar, "_median_us", lambda *a: 1.0)
    monkeypatch.setattr(bar, "_verify_step", lambda group, b, *a: fake_group.append(("step", b)))
    bar._tp_sim_worker(0, 1, "unused", _args(backends=["cpu"], sim_reps=2), _Queue())
    steps = fake_group[fake_group.index(("sync", "none")):fake_group.index("close")]
    assert steps == [e for _ in range(3) for b in ("none", "cpu") for e in (("sync", b), "barrier", ("step", b), ("sync", b))]


def test_rmsnorm_is_the_fp32_norm_rounded_to_the_input_dtype():
    """Values near 1e-3 so that eps (1e-6) weighs as much as the mean square."""
    gen = torch.Generator().manual_seed(3)
    r = (torch.randn(2, 64, generator=gen) * 1e-3).to(torch.bfloat16)
    w = torch.linspace(0.5, 2.0, 64).to(torch.bfloat16)
    rf = r.float()
    want = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16)
    assert torch.equal(bar._rmsnorm(r, w, 1e-6), want)


@pytest.mark.parametrize("backend, reduced", [("cpu", ["fused"] * 4), ("gloo", [None] * 4),
                                              ("nccl", ["the nccl group"] * 4), ("none", [])])
def test_a_verify_step_reduces_twice_a_layer_on_its_own_backend(monkeypatch, backend, reduced):
    """Ours runs the fused all-reduce + residual + RMSNorm into the step's buffers; the baseline
    all-reduces with its group, then adds and norms; "none" only adds and norms."""
    calls = []

    class Comm:
        def allreduce_residual_rmsnorm(self, partial, residual, w, eps, out, residual_out):
            assert (eps, out, residual_out) == (1e-6, partial, residual)
            calls.append("fused")
            return bar._rmsnorm(partial + residual, w, eps), partial + residual

    monkeypatch.setattr(bar.dist, "all_reduce", lambda t, group: calls.append(group))
    group = types.SimpleNamespace(comms={"cpu": Comm()}, nccl="the nccl group")
    gen = torch.Generator().manual_seed(0)
    w_in, w_out = torch.randn(16, 4, generator=gen) / 4, torch.randn(4, 16, generator=gen) / 2
    norm_w = torch.ones(16, dtype=torch.bfloat16)
    x0 = torch.randn(2, 16, generator=gen).to(torch.bfloat16)
    got = bar._verify_step(group, backend, x0.clone(), x0.clone(), (w_in, w_out), norm_w, 2)
    assert calls == reduced
    x, residual = x0, x0
    for _ in range(4):
        residual = ((x.float() @ w_in) @ w_out).to(x.dtype) + residual
        x = bar._rmsnorm(residual, norm_w, 1e-6)
    assert torch.equal(got, x)
