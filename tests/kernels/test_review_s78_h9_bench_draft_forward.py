"""Mutation audit (review s78, h9) of the draft-step benchmark's CPU side. The memory a run holds is what
check_memory counts: a batch's step inputs are freed before the next batch's are built, and the drafters
and inputs are made in their dtype, not cast from float32. The memory check names the largest shape and
reads the GPU's free memory on CUDA; --device auto on a GPU takes the CUDA defaults; bench_shape profiles
only on CUDA."""

from __future__ import annotations

import weakref

import pytest
import torch

from drafter_lab.kernels import bench_draft_forward as bdf


def test_a_batchs_inputs_are_freed_before_the_next_batchs_are_built(monkeypatch, require_draft_step_op):
    """check_memory counts, at the largest batch, two sets of step inputs per copy (with fc and without).
    The largest batch's two sets were still held while the next batch's first set was built: three."""
    require_draft_step_op("cpu")
    step_inputs, earlier, held = bdf.step_inputs, [], []

    def tracked(*a, **k):
        held.append(sum(any(r() is not None for r in refs) for refs in earlier))  # sets alive as this one is built
        sets = step_inputs(*a, **k)
        earlier.append([weakref.ref(t) for s in sets for t in s])
        return sets

    monkeypatch.setattr(bdf, "step_inputs", tracked)
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "--batch", "4", "1", "--context", "4", "--copies", "2",
                      "--reps", "1", "--warmup", "0"])
    cpu = torch.device("cpu")
    rows = bdf.bench_shape("tiny", args.batch, args, cpu, bdf.Timer(cpu, 1, 0), 1.0)
    assert [r["batch"] for r in rows] == [4, 1]
    # batch 4 with fc, then without it (the first still held); batch 1 likewise, batch 4's freed
    assert held == [0, 1, 0, 1]
    assert not any(r() is not None for refs in earlier for r in refs)  # nothing outlives the run



def test_profiling_is_cuda_only_even_where_breakdown_is_asked(require_draft_step_op):
    """parse refuses --breakdown on the CPU; bench_shape, called with it, still does not reach the CUDA profiler."""
    require_draft_step_op("cpu")
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "--batch", "1", "--context", "2", "--copies", "1",
                      "--reps", "1", "--warmup", "0"])
    args.breakdown = True
    cpu = torch.device("cpu")
    (row,) = bdf.bench_shape("tiny", args.batch, args, cpu, bdf.Timer(cpu, 1, 0), 1.0)
    assert "kernels_us" not in row


def test_auto_on_a_gpu_machine_takes_the_cuda_defaults(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a = bdf.parse(["--device", "auto"])
    assert (a.device, a.shapes, a.dtype, a.context, a.compile_mode) == ("cuda", ["llama3.1-8b", "kimi-k2"], "bf16",
                                                                        1024, "default")


def test_the_memory_check_names_the_largest_shape_wherever_it_was_given(monkeypatch):
    """small needs more than tiny: named (its figure the one compared) though tiny came last."""
    args = bdf.parse(["--device", "cpu", "--shapes", "small", "tiny", "--batch", "1", "--context", "1"])
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: 1000)
    with pytest.raises(bdf.LabError, match="^--context 1: 4 copies of small at batch 1 need "):
        bdf.check_memory(args, torch.device("cpu"))


def test_on_cuda_the_memory_check_counts_the_gpus_free_memory_not_the_hosts(monkeypatch):
    """torch.cuda.mem_get_info is (free, total) on that GPU; the host's memory does not hold the caches."""
    args = bdf.parse(["--device", "cuda", "--shapes", "tiny", "--batch", "2", "--context", "200000"])
    drafter = bdf.make_drafter("tiny", torch.bfloat16, "meta", 0)
    need = 4 * (sum(p.numel() * 2 for p in drafter.parameters()) + 2 * bdf.step_bytes(drafter, 2, 200000)[1])
    asked, free = [], [need - 1]

    def mem_get_info(device=None):
        asked.append(device)
        return free[0], 10**15

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: 10**15)
    gpu = torch.device("cuda", 0)
    with pytest.raises(bdf.LabError) as e:
        bdf.check_memory(args, gpu)
    assert str(e.value).endswith(f"need {need / 1e9:.1f} GB for weights and KV caches, more than the "
                                 f"{(need - 1) / 1e9:.1f} GB free on cuda:0")
    free[0] = need
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: 0)
    bdf.check_memory(args, gpu)  # fits on the GPU, however little the host has
    assert asked == [gpu, gpu]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_drafter_and_its_inputs_are_made_in_their_dtype_not_cast_from_float32(dtype, monkeypatch):
    """A float32 drafter (or cache) cast down held both for a moment, three times the half-precision
    bytes: past what check_memory counts (each copy's weights and its two sets of inputs)."""
    made, randn = [], torch.randn

    class Recorded(bdf.Eagle3Drafter):
        def __init__(self, cfg):
            super().__init__(cfg)
            made.append({p.dtype for p in self.parameters()})

    def recorded_randn(*a, **k):
        out = randn(*a, **k)
        made.append({out.dtype})
        return out

    monkeypatch.setattr(bdf, "Eagle3Drafter", Recorded)
    monkeypatch.setattr(torch, "randn", recorded_randn)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "--dtype", name, "--context", "2", "--copies", "1"])
    drafter = bdf.make_drafter("tiny", dtype, "cpu", 0)
    bdf.step_inputs([drafter], 2, args, "cpu")
    assert len(made) == 1 + 4 and all(m == {dtype} for m in made), made  # the drafter, then embeds, hidden, k, v
    assert {p.dtype for p in drafter.parameters()} == {dtype} and torch.get_default_dtype() == torch.float32
