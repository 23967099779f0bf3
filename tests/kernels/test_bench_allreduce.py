"""The all-reduce benchmark's plumbing on CPU: ranks spawned as processes, the latency table with
each size's algorithm and the ratio against gloo, and the verify-step simulator's JSON in the form
the cost model reads. Timings are printed, never asserted."""

from __future__ import annotations

import json

import pytest

from drafter_lab.kernels import _ext

pytestmark = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")

SIZES = {"1 KB": 1024, "256 KB": 256 << 10}


def test_latency_table_names_each_sizes_algorithm(capsys):
    from drafter_lab.kernels.bench_allreduce import main

    argv = ["--ranks", "2", "--sizes", *map(str, SIZES.values()), "--iters", "50", "--backends", "cpu", "gloo"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 ranks on this host" in out
    rows = {label: line.split() for line in out.splitlines() for label in SIZES if line.strip().startswith(label + " ")}
    assert set(rows) == set(SIZES), out
    for label, cells in rows.items():  # size (two words), cpu us, gloo us, cpu algo, gloo/cpu
        cpu_us, gloo_us, algo, ratio = float(cells[2]), float(cells[3]), cells[4], cells[5]
        assert cpu_us > 0 and gloo_us > 0 and algo in ("1-shot", "2-shot"), (label, cells)
        assert ratio.endswith("x") and float(ratio[:-1]) == pytest.approx(gloo_us / cpu_us, rel=0.05, abs=0.1)


def test_tp_sim_writes_what_the_cost_model_reads(tmp_path):
    from drafter_lab.kernels.bench_allreduce import HIDDEN, main
    from drafter_lab.spec.costinputs import apply_inputs
    from drafter_lab.spec.costmodel import CostModelConfig

    out = tmp_path / "sim.json"
    argv = ["--tp-sim", "--ranks", "2", "--backends", "cpu", "gloo", "--layers", "2", "--tokens", "1", "2",
            "--sim-reps", "1", "--iters", "20", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    sizes = {str(t * HIDDEN * 2) for t in (1, 2)}  # bfloat16 [tokens, hidden] partial sums
    assert {b: set(t) for b, t in report["allreduce_us"].items()} == {"cpu": sizes, "gloo": sizes}
    assert {b: set(t) for b, t in report["verify_ms"].items()} == {b: {"1", "2"} for b in ("none", "cpu", "gloo")}
    assert report["meta"]["allreduces_per_step"] == 4
    for b in ("cpu", "gloo"):
        flat = out.with_name(f"sim.costmodel-{b}.json")
        _, measured = apply_inputs(CostModelConfig(), flat)
        assert measured == {int(s): us for s, us in report["allreduce_us"][b].items()}


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "0"], "--ranks must be in 1..16, got 0"),  # no rank would ever report: it waited forever
    (["--ranks", "2", "17"], "--ranks must be in 1..16, got 17$"),  # the one out of range
    (["--backends", "cpu", "nvlink"], "unknown backend\\(s\\) nvlink; known: cpu, cuda-host, cuda-ipc, gloo, nccl"),
    (["--iters", "0"], "--iters must be at least 1"),
    # each was a rank's traceback, a silent 2-byte message, or a 0-byte row in the cost model's JSON
    (["--sizes", "-4096", "0"], "--sizes must be at least 1, got -4096 0"),
    (["--tp-sim", "--tokens", "0"], "--tokens must be at least 1"),
    (["--tp-sim", "--sim-reps", "0"], "--sim-reps must be at least 1"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds"),
])
def test_bad_ranks_backends_and_iters_are_refused(argv, message):
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.bench_allreduce import main

    with pytest.raises(LabError, match=f"^{message}"):
        main(["--backends", "cpu", *argv])


def test_sizes_are_labelled_by_the_bytes_sent_and_iters_are_honoured(capsys):
    from drafter_lab.kernels.bench_allreduce import _iters, main

    assert main(["--ranks", "1", "--sizes", "3", "2", "1024", "--iters", "10", "--backends", "cpu"]) == 0
    sizes = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.split()[1:2] in (["B"], ["KB"])]
    assert sizes == [["2", "B"], ["1", "KB"]]  # bfloat16: 3 bytes send one element, as 2 do
    assert (_iters(1024, 10), _iters(1 << 20, 2000), _iters(1 << 20, 100)) == (10, 125, 50)


def test_a_world_no_backend_can_run_is_refused(monkeypatch):
    """GPU backends with fewer GPUs than ranks are dropped; with nothing left the run printed an empty
    table (or wrote a simulator JSON without an all-reduce) and exited 0."""
    from drafter_lab.errors import LabError
    from drafter_lab.kernels import bench_allreduce

    monkeypatch.setattr(bench_allreduce.torch.cuda, "is_available", lambda: False)
    with pytest.raises(LabError, match="^2 ranks: none of nccl can run here"):
        bench_allreduce.main(["--ranks", "2", "--backends", "nccl"])


def test_a_sum_beyond_capacity_is_labelled_by_its_chunks():
    """The native side picks each capacity-sized chunk's algorithm by that chunk's size: a 2 MB sum on a
    1 MB communicator whose one-shot covers its capacity runs two one-shot chunks, not a two-shot."""
    import os

    from drafter_lab.kernels.allreduce import Communicator
    from drafter_lab.kernels.bench_allreduce import _algo_name

    with Communicator(0, 1, name=f"test-label-{os.getpid()}", max_bytes=1 << 20) as comm:
        comm.one_shot_max_bytes = comm.capacity
        assert _algo_name(comm, 2 << 20) == "2x 1-shot"
        assert _algo_name(comm, comm.capacity) == "1-shot"
        comm.one_shot_max_bytes = 0
        assert _algo_name(comm, (2 << 20) + 2) == "3x 2-shot"


def test_fastest_tables_take_each_sizes_fastest_algorithm(tmp_path):
    """--gpu-streams' columns -> one flat table per backend and rank count, which the cost model reads."""
    from drafter_lab.kernels.bench_allreduce import fastest_tables
    from drafter_lab.spec.costinputs import apply_inputs
    from drafter_lab.spec.costmodel import CostModelConfig

    columns = {
        "2 ranks, cuda-ipc 1-shot": {"1024": 6.9, "57344": 6.1, "1048576": 12.3},
        "2 ranks, cuda-ipc 2-shot": {"1024": 10.0, "57344": 8.9, "1048576": 12.9},
        "2 ranks, cuda-ipc LL": {"1024": 5.1, "57344": 5.2},
        "4 ranks, cuda-ipc LL": {"1024": 8.8},
        "2 ranks, cuda-host 1-shot": {"1024": 8.8},
    }
    tables = fastest_tables(columns)
    assert tables == {"cuda-ipc-2ranks": {"1024": 5.1, "57344": 5.2, "1048576": 12.3},
                      "cuda-ipc-4ranks": {"1024": 8.8}, "cuda-host-2ranks": {"1024": 8.8}}
    path = tmp_path / "ipc.json"
    path.write_text(json.dumps({"allreduce_us": tables["cuda-ipc-2ranks"]}))
    assert apply_inputs(CostModelConfig(), path)[1] == {1024: 5.1, 57344: 5.2, 1048576: 12.3}
