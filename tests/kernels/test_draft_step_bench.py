"""The draft-step benchmark runs end to end at a tiny CPU shape and writes the cost-model JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.kernels import bench_draft_forward as bench


def test_bench_cpu_tiny(tmp_path, capsys, require_draft_step_op):
    require_draft_step_op("cpu")
    out = tmp_path / "bench.json"
    table = tmp_path / "bench.md"
    argv = ["--device", "cpu", "--shapes", "tiny", "--batch", "1", "3", "--context", "8", "--copies", "2",
            "--reps", "2", "--warmup", "1", "--json", str(out), "--markdown", str(table)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"draft_step_us", "draft_step_us_by_batch", "draft_extend_us_by_batch", "meta"}
    rows = result["meta"]["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["us"] > 0 and r["no_fc_us"] > 0 and r["ref_eager_us"] > 0 and 0 < r["floor_us"] and r["gbs"] > 0
        assert 0 < r["no_fc_pct_floor"]
    # a cycle's first draft reads the aux states through fc (the extend); its later steps do not
    assert result["draft_step_us_by_batch"] == {str(r["batch"]): r["no_fc_us"] for r in rows}
    assert result["draft_extend_us_by_batch"] == {str(r["batch"]): r["us"] for r in rows}
    assert result["draft_step_us"] == result["draft_step_us_by_batch"]["1"]
    assert (result["meta"]["draft_tables_from"], result["meta"]["extend_tokens"]) == ("tiny", 1)
    assert result["meta"]["copy_bandwidth_gbs"] > 0
    printed = capsys.readouterr().out
    assert "tiny B=1" in printed and "vs eager" in printed and "| no fc " in printed
    # The README's table: a row per batch, the same numbers, n/a for what a CPU run does not measure.
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| drafter shape | batch | floor |") and len(lines) == 2 + len(rows)
    for line, r in zip(lines[2:], rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == ["tiny", str(r["batch"]), f"{r['floor_us']:.0f}"]
        assert cells[3] == f"**{r['us']:.0f}** ({r['pct_floor']:.0f} %)"
        assert cells[5] == f"{r['ref_eager_us']:.0f}" and cells[6:] == ["n/a", "n/a", "n/a"]
    # The cost model reads the file as its measured inputs.
    from drafter_lab.spec.costinputs import apply_inputs
    from drafter_lab.spec.costmodel import CostModel, CostModelConfig

    cfg, _ = apply_inputs(CostModelConfig(), out)
    assert cfg.draft_step_us == pytest.approx(result["draft_step_us"])
    for batch, us in result["draft_step_us_by_batch"].items():  # the draft step at each measured batch
        m = CostModel(dataclasses.replace(cfg, batch=int(batch)))
        assert m.draft_step_us == pytest.approx(us)
        extend = result["draft_extend_us_by_batch"][batch]
        assert m.draft_ms == pytest.approx((extend + (cfg.steps - 1) * us) / 1000)


def test_bench_rejects_missing_gpu(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    with pytest.raises(bench.LabError, match="no CUDA device"):
        bench.main(["--device", "cuda"])


@pytest.mark.parametrize("argv,message", [(["--batch", "0"], "--batch 0: must be >= 1"),
                                          (["--batch", "1", "-1"], "--batch -1: must be >= 1"),
                                          (["--topk", "0"], "--topk 0: must be >= 1"),
                                          (["--copies", "0"], "--copies 0: must be >= 1"),
                                          (["--context", "0"], "--context 0: must be >= 1"),
                                          (["--reps", "0"], "--reps 0: must be >= 1"),
                                          (["--warmup", "-1"], "--warmup -1: must be >= 0")])
def test_bench_refuses_counts_below_one(argv, message, capsys):
    """Each was a traceback deep in the op (batch, topk, copies) or silently its default (context, reps)."""
    with pytest.raises(SystemExit) as e:
        bench.parse(["--device", "cpu", *argv])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(f" error: {message}\n")


@pytest.mark.parametrize("argv,most", [(["--device", "cpu", "--shapes", "tiny", "--topk", "2001"], 2000),
                                       (["--device", "cuda", "--topk", "17"], 16)])
def test_bench_refuses_topk_the_op_does_not_take(argv, most, capsys):
    """Past the draft vocab (or, on CUDA, past the kernels' top-k) was a traceback deep in the op."""
    with pytest.raises(SystemExit) as e:
        bench.parse(argv)
    assert e.value.code == 2 and f"--topk {argv[-1]}: must be <= {most}" in capsys.readouterr().err
    assert bench.parse(argv[:-1] + [str(most)]).topk == most


class _SetDevice(Exception):
    """Stops main at torch.cuda.set_device, once torch's own index check has passed."""


@pytest.mark.parametrize("name,index", [("cuda", 0), ("cuda:0", 0)])
def test_bench_bare_cuda_is_the_current_device(monkeypatch, name, index):
    """--device cuda (the default on a GPU) was torch.cuda.set_device's ValueError: no index."""
    cuda = bench.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)

    def set_device(device):
        got.append(cuda._utils._get_device_index(device))
        raise _SetDevice

    got = []
    monkeypatch.setattr(cuda, "set_device", set_device)
    with pytest.raises(_SetDevice):
        bench.main(["--device", name])
    assert got == [index]
