"""Review s65 (mutation audit) of the draft-step benchmark: the numbers in its rows (floor, GB/s, % of
floor, with and without fc) follow from the bytes a step moves and the measured copy bandwidth; the
reference is timed as the reference and the no-fc column on a step without fc; the timer rotates over
the copies and takes the median; the printed ratios and the README table's "vs best"; the defaults per
device, the cost model's tables, and the refusals before the timing."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_draft_forward as bdf


def test_row_numbers_follow_from_the_bytes_and_the_copy_bandwidth(tmp_path, monkeypatch, require_draft_step_op):
    require_draft_step_op("cpu")
    calls = []
    step = bdf.ds.draft_step

    def recorded(drafter, embeds, hidden, *rest, use_fused):
        calls.append((use_fused, hidden.shape[-1]))
        return step(drafter, embeds, hidden, *rest, use_fused=use_fused)

    monkeypatch.setattr(bdf.ds, "draft_step", recorded)
    out = tmp_path / "b.json"
    argv = ["--device", "cpu", "--shapes", "tiny", "--batch", "2", "--context", "8", "--copies", "2", "--reps", "2",
            "--warmup", "0", "--json", str(out)]
    assert bdf.main(argv) == 0
    s = bdf.SHAPES["tiny"]
    # the reference steps through fc only; the fused op with fc (us) and without it (no_fc_us)
    assert {c for c in calls if not c[0]} == {(False, 3 * s["target_hidden_size"])}
    assert {c for c in calls if c[0]} == {(True, 3 * s["target_hidden_size"]), (True, s["hidden_size"])}
    result = json.loads(out.read_text())
    (row,), copy_gbs = result["meta"]["rows"], result["meta"]["copy_bandwidth_gbs"]
    drafter = bdf.make_drafter("tiny", torch.float32, "meta", 0)
    weights, kv = bdf.step_bytes(drafter, 2, 8)
    no_fc, _ = bdf.step_bytes(drafter, 2, 8, fc=False)
    assert row["floor_us"] == pytest.approx((weights + kv) / copy_gbs / 1e3)
    assert row["gbs"] == pytest.approx((weights + kv) / row["us"] / 1e3)
    assert row["pct_floor"] == pytest.approx(100 * row["floor_us"] / row["us"])
    assert row["no_fc_pct_floor"] == pytest.approx(100 * (no_fc + kv) / copy_gbs / 1e3 / row["no_fc_us"])


def test_copy_bandwidth_counts_bytes_read_and_written():
    timed = []

    def timer(fns):
        fns[0]()
        timed.append(len(fns))
        return 500.0  # us

    assert bdf.copy_bandwidth(torch.device("cpu"), timer, 1 << 20) == pytest.approx(2 * (1 << 20) / 500 / 1e3)
    assert timed == [1]


def test_the_timer_rotates_over_the_copies_and_takes_the_median(monkeypatch):
    """Each copy in turn (so no copy's weights stay in cache), warm-up included; one slow call among
    them does not move the median."""
    clock = [0.0]
    monkeypatch.setattr(bdf.time, "perf_counter", lambda: clock[0])
    counts = [0, 0, 0]

    def call(i, seconds):
        def f():
            counts[i] += 1
            clock[0] += seconds
        return f

    timer = bdf.Timer(torch.device("cpu"), reps=6, warmup=3)
    assert timer([call(0, 1e-6), call(1, 1e-6), call(2, 1.0)]) == pytest.approx(1.0)  # median of 1,1,1e6,1,1,1e6 us
    assert counts == [3, 3, 3]


CUDA_ROW = dict(shape="kimi-k2", batch=8, us=50.0, eager_us=80.0, gbs=1000.0, pct_floor=60.0, floor_us=30.0,
                ref_eager_us=400.0, ref_graph_us=150.0, ref_compile_us=100.0, no_fc_us=45.0, no_fc_pct_floor=55.0)


def test_printed_ratios_are_the_references_time_over_ours(capsys):
    bdf.print_row(CUDA_ROW)
    bdf.print_row({k: v for k, v in CUDA_ROW.items() if k != "ref_compile_us"})
    first, second = capsys.readouterr().out.splitlines()
    assert "vs eager 8.00x  graph 3.00x  compile 2.00x" in first
    assert "compile n/a" in second


def test_markdown_vs_best_is_against_the_faster_baseline():
    rows = [CUDA_ROW, {k: v for k, v in CUDA_ROW.items() if k != "ref_compile_us"},
            {k: v for k, v in CUDA_ROW.items() if k not in ("ref_compile_us", "ref_graph_us")}]
    lines = bdf.markdown_table(rows).splitlines()[2:]
    assert lines[0] == "| Kimi-K2 | 8 | 30 | **50** (60 %) | 80 | 400 | 150 | 100 | 2.00x |"
    assert lines[1].endswith("| 150 | n/a | 3.00x |")
    assert lines[2].endswith("| n/a | n/a | n/a |")


@pytest.mark.parametrize("device, want", [
    ("cuda", (["llama3.1-8b", "kimi-k2"], [1, 8, 32], 1024, "bf16", 200, 20, "default")),
    ("cpu", (["tiny", "small"], [1, 4], 128, "fp32", 10, 2, "none")),
])
def test_defaults_per_device(device, want):
    """The README's table is the CUDA defaults; the CPU's keep a run to seconds."""
    a = bdf.parse(["--device", device])
    assert (a.shapes, a.batch, a.context, a.dtype, a.reps, a.warmup, a.compile_mode) == want


def _row(shape, batch):
    return {"shape": shape, "batch": batch, "us": 100.0 * batch + len(shape), "no_fc_us": 10.0 * batch + len(shape)}


def test_cost_inputs_take_kimi_wherever_it_was_measured_and_the_smallest_batch():
    rows = [_row("tiny", 4), _row("tiny", 1), _row("kimi-k2", 8), _row("kimi-k2", 2)]
    shape, tables = bdf.cost_inputs(rows)
    assert shape == "kimi-k2"
    assert tables["draft_step_us"] == _row("kimi-k2", 2)["no_fc_us"]
    assert tables["draft_step_us_by_batch"] == {"2": 27.0, "8": 87.0}
    assert tables["draft_extend_us_by_batch"] == {"2": 207.0, "8": 807.0}
    assert bdf.cost_inputs(rows[:2])[0] == "tiny"


def test_memory_check_names_the_largest_shape_at_the_largest_batch(monkeypatch):
    monkeypatch.setattr(bdf, "host_available_bytes", lambda: 10**6)
    args = bdf.parse(["--device", "cpu", "--shapes", "tiny", "small", "--batch", "4", "1", "--context", "1000"])
    with pytest.raises(LabError, match="^--context 1000: 4 copies of small at batch 4 need "):
        bdf.check_memory(args, torch.device("cpu"))


def test_a_device_the_op_has_no_kernel_for_is_refused_before_the_timing(monkeypatch):
    monkeypatch.setattr(bdf.ds, "available", lambda device=None: False)
    monkeypatch.setattr(bdf, "check_memory", lambda *a: pytest.fail("went on past the missing kernel"))
    with pytest.raises(LabError, match="^the fused draft_step op has no cpu kernel: build drafter_lab._C first$"):
        bdf.main(["--device", "cpu", "--shapes", "tiny"])


def test_a_shape_or_batch_given_twice_is_timed_once():
    """Was timed twice and printed as two rows (in the README table and the JSON's rows too), where
    `bench allreduce` keeps each value once."""
    a = bdf.parse(["--device", "cpu", "--shapes", "tiny", "small", "tiny", "--batch", "4", "1", "4"])
    assert (a.shapes, a.batch) == (["tiny", "small"], [4, 1])
