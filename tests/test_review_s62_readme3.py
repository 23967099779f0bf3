"""README "Speculative decoding on the tiny pair", "The transfer study" and the CPU kernels checked
against the code (review s62, part 3)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.kernels import _ext

needs_ext = pytest.mark.skipif(not _ext.available(), reason=_ext.unavailable_reason() or "extension built")


@needs_ext
def test_bench_allreduce_latency_table_writes_json_the_cost_model_reads(tmp_path, capsys):
    """`--json` was refused for the latency table, so the CPU table the README prints could reach the
    cost model only by hand: it now writes the table, keyed as --gpu-streams keys its columns, and a
    flat table per backend and rank count beside it."""
    from drafter_lab.kernels.bench_allreduce import main
    from drafter_lab.spec.costinputs import apply_inputs, read_inputs
    from drafter_lab.spec.costmodel import CostModelConfig

    out = tmp_path / "lat.json"
    argv = ["--ranks", "2", "--sizes", "1024", "4096", "--iters", "20", "--backends", "cpu", "gloo", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert {k: set(v) for k, v in report["allreduce_us"].items()} == {
        "2 ranks, cpu": {"1024", "4096"}, "2 ranks, gloo": {"1024", "4096"}}
    assert set(report["algos"]) == {"2 ranks, cpu"}  # gloo picks its own
    assert report["meta"]["ranks"] == [2] and report["meta"]["dtype"] == "bfloat16"
    for backend in ("cpu", "gloo"):
        flat = tmp_path / f"lat.costmodel-{backend}-2ranks.json"
        _, measured = apply_inputs(CostModelConfig(), flat)
        assert measured == {int(s): us for s, us in report["allreduce_us"][f"2 ranks, {backend}"].items()}
    with pytest.raises(LabError, match="lat.costmodel-cpu-2ranks.json"):  # the main file names those beside it
        read_inputs(out)
    assert "2 ranks on this host" in capsys.readouterr().out  # still printed


@needs_ext
def test_bench_allreduce_latency_json_that_cannot_be_written_is_refused_before_timing(tmp_path, monkeypatch):
    from drafter_lab.kernels import bench_allreduce

    monkeypatch.setattr(bench_allreduce, "_run", lambda *a, **k: pytest.fail("timed before refusing --json"))
    with pytest.raises(LabError, match="is a directory: --json takes a file to write"):
        bench_allreduce.main(["--ranks", "2", "--backends", "cpu", "--json", str(tmp_path)])


@needs_ext
def test_bench_allreduce_latency_table_without_json_writes_nothing(tmp_path, monkeypatch):
    """Printed only, as before: not the tp-sim's default file."""
    from drafter_lab.kernels import bench_allreduce

    monkeypatch.chdir(tmp_path)
    assert bench_allreduce.main(["--ranks", "1", "--sizes", "1024", "--iters", "5", "--backends", "cpu"]) == 0
    assert list(tmp_path.iterdir()) == []
