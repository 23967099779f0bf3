"""Mutation audit (review s77, h5) of the draft-step benchmark: its shapes are drafters the op can run
(grouped-query heads, halves to rotate, their targets' width; Llama-3.1-8B's as published), its drafters
are reproducible with norms drawn around one; a step's inputs per copy, one copy alone, the cost tables
without Kimi, the memory check's figure and its exact fit, the refusals' wording (top-k bounds, CUDA-only
flags on the CPU), the default device, a cuda index kept, and the `python -m` entry."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_draft_forward as bdf


@pytest.mark.parametrize("name", sorted(bdf.SHAPES))
def test_each_shape_is_a_drafter_of_its_targets_width_the_op_can_run(name):
    s = bdf.SHAPES[name]
    assert s["hidden_size"] == s["target_hidden_size"]  # an EAGLE-3 drafter is as wide as its target
    assert s["num_attention_heads"] % s["num_key_value_heads"] == 0  # each K/V head serves a whole group
    assert s["head_dim"] % 2 == 0  # RoPE rotates its two halves


def test_the_llama_shape_is_llama_3_1_8b():
    """The README table's row is titled Llama-3.1-8B: its published dims, with the 32k draft vocab."""
    assert bdf.SHAPES["llama3.1-8b"] == dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                             head_dim=128, intermediate_size=14336, draft_vocab_size=32000,
                                             target_hidden_size=4096)
    assert bdf.TITLES["llama3.1-8b"] == "Llama-3.1-8B"


def test_a_drafter_is_its_seeds_with_norms_around_one():
    a, again, other = (bdf.make_drafter("tiny", torch.float32, "cpu", seed) for seed in (0, 0, 1))
    assert all(torch.equal(p, again.state_dict()[n]) for n, p in a.state_dict().items())
    assert not torch.equal(a.fc.weight, other.fc.weight)
    params = dict(a.named_parameters())
    norms = {n: p for n, p in params.items() if p.dim() == 1}
    assert len(norms) == 4
    for n, p in norms.items():
        assert 0.5 <= p.min() and p.max() <= 1.5 and p.std() > 0.2, n  # uniform on [0.5, 1.5]: std 0.29
    for n, p in params.items():
        if p.dim() == 2:  # the matrices keep the model's own initialisation, centred on zero
            assert p.min() < 0 < p.max(), n
    assert not a.training and a.fc.weight.dtype == torch.float32


def test_each_copy_gets_inputs_of_a_step_at_context():
    """The cache holds context + 1 entries (this step's K/V lands at index context), one copy alone too."""
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "--context", "5", "--copies", "1"])
    drafters = [bdf.make_drafter("tiny", torch.float32, "cpu", 0)]
    s = bdf.SHAPES["tiny"]
    for fc, width in ((True, 3 * s["target_hidden_size"]), (False, s["hidden_size"])):
        (embeds, hidden, lens, k, v, lens_after), = bdf.step_inputs(drafters, 3, args, "cpu", fc=fc)
        assert (embeds.shape, hidden.shape) == ((3, s["hidden_size"]), (3, width))
        assert k.shape == v.shape == (3, s["num_key_value_heads"], 6, s["head_dim"])
        assert lens.tolist() == lens_after.tolist() == [5, 5, 5] and lens is not lens_after


def test_one_copy_is_timed_too(tmp_path, require_draft_step_op):
    """--copies 1 (no rotation: a cache-warm figure, but a run): each row's bytes are that copy's."""
    require_draft_step_op("cpu")
    out = tmp_path / "one.json"
    assert bdf.main(["--device", "cpu", "--shapes", "tiny", "--batch", "1", "--context", "4", "--copies", "1",
                     "--reps", "1", "--warmup", "0", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["meta"]["rows"]
    assert row["batch"] == 1 and row["us"] > 0 and row["no_fc_pct_floor"] > 0


def test_the_cost_tables_come_from_the_first_shape_measured_without_kimi():
    rows = [{"shape": s, "batch": 1, "us": us, "no_fc_us": us / 2} for s, us in (("small", 8.0), ("tiny", 2.0))]
    assert bdf.cost_inputs(rows) == ("small", {"draft_step_us": 4.0, "draft_step_us_by_batch": {"1": 4.0},
                                               "draft_extend_us_by_batch": {"1": 8.0}})


def _need(args, name: str) -> int:
    """The memory a shape's run holds: every copy's weights (embedding included) and two step inputs' caches."""
    drafter = bdf.make_drafter(name, bdf.DTYPES[args.dtype], "meta", 0)
    s = bdf.SHAPES[name]
    cache = 2 * max(args.batch) * s["num_key_value_heads"] * (args.context + 1) * s["head_dim"] * 4
    return args.copies * (sum(p.numel() * 4 for p in drafter.parameters()) + 2 * cache)


def test_the_memory_check_counts_the_weights_and_lets_an_exact_fit_run(monkeypatch):
    """small at context 1 is mostly weights (fp32 on the CPU): the figure is theirs, to the 0.1 GB."""
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "small", "--batch", "2", "--context", "1"])
    need = _need(args, "small")
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: need - 1)
    with pytest.raises(LabError) as e:
        bdf.check_memory(args, torch.device("cpu"))
    assert str(e.value) == (f"--context 1: 4 copies of small at batch 2 need {need / 1e9:.1f} GB for weights and KV "
                            f"caches, more than the {(need - 1) / 1e9:.1f} GB free on cpu")
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: need)
    bdf.check_memory(args, torch.device("cpu"))  # fits exactly


@pytest.mark.parametrize("device, suffix", [("cpu", "(the draft vocab)"), ("cuda", "(the draft vocab, and the CUDA kernels)")])
def test_a_topk_past_its_bound_names_what_bounds_it(device, suffix, capsys):
    most = bdf.SHAPES["tiny"]["draft_vocab_size"] if device == "cpu" else 16
    with pytest.raises(SystemExit):
        bdf.parse(["--device", device, "--shapes", "tiny", "--topk", str(most + 1)])
    assert capsys.readouterr().err.endswith(f"error: --topk {most + 1}: must be <= {most} {suffix}\n")


@pytest.mark.parametrize("argv, message", [
    (["--breakdown"], "--breakdown: per-kernel device times come from the CUDA profiler; not on the CPU"),
    (["--compile-mode", "default"], "--compile-mode: the torch.compile baseline is timed on CUDA only"),
])
def test_what_only_cuda_measures_is_refused_on_the_cpu_and_taken_on_cuda(argv, message, capsys):
    for cpu in ("cpu", "cpu:0"):
        with pytest.raises(SystemExit) as e:
            bdf.parse(["--device", cpu, *argv])
        assert e.value.code == 2 and capsys.readouterr().err.endswith(f"error: {message}\n")
    a = bdf.parse(["--device", "cuda", *argv])
    assert (a.breakdown, a.compile_mode) == ("--breakdown" in argv, "default")
    assert bdf.parse(["--device", "cpu", "--compile-mode", "none"]).compile_mode == "none"


@pytest.mark.parametrize("gpu", [False, True])
def test_the_default_device_is_the_gpu_where_there_is_one(gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    a = bdf.parse([])
    assert (a.device, a.topk, a.copies) == ("cuda" if gpu else "cpu", 4, 4)


class _SetDevice(Exception):
    pass


def test_a_cuda_index_given_is_kept(monkeypatch):
    """cuda:1 on a machine whose current device is 0: the timing runs on 1."""
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    got = []

    def set_device(device):
        got.append(device)
        raise _SetDevice

    monkeypatch.setattr(cuda, "set_device", set_device)
    with pytest.raises(_SetDevice):
        bdf.main(["--device", "cuda:1"])
    assert got == [torch.device("cuda", 1)]


def test_python_dash_m_runs_it_and_says_a_bad_device_in_one_line():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "drafter_lab.kernels.bench_draft_forward", "--device", "gpu"],
                       capture_output=True, text=True, timeout=300)
    assert (p.returncode, p.stdout) == (2, "") and p.stderr.startswith("error: unknown device 'gpu'"), p.stderr
    assert len(p.stderr.splitlines()) == 1
