"""`bench verify`: the target's passes by batch and tokens, the line through them, and the cost model
that reads them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.bench_verify import fit_verify
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import PRESETS, CostModel

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_fit_recovers_a_line_and_reports_its_worst_error():
    line = {1: {1: 2.5, 4: 4.0}, 4: {1: 4.0, 4: 10.0}}  # ms = 2 + 0.5 x (B x T)
    a, b, worst = fit_verify(line)
    assert (a, b, worst) == pytest.approx((2.0, 0.5, 0.0))
    bent = {1: {1: 2.0, 4: 2.2}, 4: {4: 10.0}}  # flat, then growing: no line fits every point
    assert fit_verify(bent)[2] > 0.1
    assert fit_verify({1: {1: 2.0}}) is None and fit_verify({1: {4: 2.0}, 4: {1: 3.0}}) is None


def test_bench_verify_feeds_the_cost_model(random_llama, drafter_dir, trained_drafter, tmp_path, capsys):
    out = tmp_path / "verify.json"
    assert main(["bench", "verify", "--target", str(random_llama), "--drafter", str(drafter_dir), "--tokens", "1,3",
                 "--batch", "1,2", "--context", "8", "--reps", "2", "--warmup", "0", "--threads", "1",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "verify pass, ms" in text and "fit: ms =" in text
    r = json.loads(out.read_text())
    table = {int(b): {int(t): ms for t, ms in row.items()} for b, row in r["verify_ms_by_tokens"].items()}
    assert set(table) == {1, 2} and all(set(row) == {1, 3} and min(row.values()) > 0 for row in table.values())
    assert r["decode_ms"] == table[1][1]
    # the passes return the drafter's aux states, as the engine's verify does
    assert r["meta"]["aux_layer_ids"] == trained_drafter.config.aux_layer_ids
    assert set(r["draft_step_us_by_batch"]) == set(r["draft_extend_us_by_batch"]) == {"1", "2"}
    assert r["deployment"] == {"num_layers": 8, "hidden_size": 64, "dtype_bytes": 4, "allreduces_per_layer": 0,
                               "cycle_overhead_ms": 0.0, "decode_overhead_ms": 0.0}
    cfg, _ = apply_inputs(PRESETS[SEEDS], out)
    m, two = CostModel(cfg), CostModel(dataclasses.replace(cfg, batch=2, verify_tokens=3))
    assert (cfg.num_layers, m.n_allreduce) == (8, 0)
    # passes are read where they were measured, and between and beyond them along the last segment
    assert (m.decode_ms(), two.decode_ms(), two.verify_ms()) == (table[1][1], table[2][1], table[2][3])
    # (never downward: at these tiny shapes a noisy pass of more tokens can time below one of fewer)
    assert m.verify_ms() == pytest.approx(table[1][3] + max(table[1][3] - table[1][1], 0) / 2)  # the preset's 4
    assert CostModel(dataclasses.replace(cfg, batch=3, verify_tokens=3)).verify_ms() == pytest.approx(
        table[2][3] + max(table[2][3] - table[1][3], 0))
    assert two.draft_step_us == pytest.approx(r["draft_step_us_by_batch"]["2"])
    # a cycle drafts the extend over the accepted tokens, then steps - 1 steps
    step, extend = r["draft_step_us_by_batch"]["2"], r["draft_extend_us_by_batch"]["2"]
    assert two.draft_ms == pytest.approx((extend + (cfg.steps - 1) * step) / 1000)
    # a flag given on the command line wins over the files; host work adds to a cycle and to a plain step
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--cycle-overhead-ms", "1.5", "--decode-overhead-ms", "0.5",
                 "--json", str(model)]) == 0
    assert "overhead 0.50 ms" in capsys.readouterr().out
    priced = json.loads(model.read_text())
    assert (priced["config"]["cycle_overhead_ms"], priced["config"]["decode_overhead_ms"]) == (1.5, 0.5)
    assert priced["decode_ms"] == pytest.approx(table[1][1] + 0.5)
    assert priced["cycle_ms"] == pytest.approx(m.cycle_ms() + 1.5)


def test_bench_verify_on_a_target_without_tokenizer(tmp_path, capsys):
    """device_check.sh benches a random target written by tests/kernels/random_target.py."""
    import runpy
    from pathlib import Path

    model = tmp_path / "random"
    script = Path(__file__).parents[1] / "kernels" / "random_target.py"
    runpy.run_path(str(script), run_name="not_main")["main"](
        [str(model), "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
         "--vocab", "256"])
    assert not list(model.glob("tokenizer*"))
    out = tmp_path / "verify.json"
    # the plain decode step (T = 1) is always measured: the baseline is priced from it
    assert main(["bench", "verify", "--target", str(model), "--tokens", "4", "--batch", "1", "--context", "8",
                 "--reps", "2", "--warmup", "0", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["deployment"]["num_layers"] == 2 and r["deployment"]["dtype_bytes"] == 4  # loaded as float32
    assert set(r["verify_ms_by_tokens"]["1"]) == {"1", "4"} and "draft_step_us_by_batch" not in r
    assert r["decode_ms"] == r["verify_ms_by_tokens"]["1"]["1"] and r["meta"]["aux_layer_ids"] == []
    # one point cannot fit a line, and is written all the same
    capsys.readouterr()
    assert main(["bench", "verify", "--target", str(model), "--tokens", "1", "--batch", "2", "--context", "8",
                 "--reps", "2", "--warmup", "0", "--json", str(out)]) == 0
    assert "time two token counts to fit a line" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["meta"]["fit"] is None and r["decode_ms"] == r["verify_ms_by_tokens"]["2"]["1"]


@pytest.mark.parametrize("content, match", [
    ({"verify_ms_by_tokens": {"1": {}}}, "must map batch sizes .>= 1. to"),
    ({"verify_ms_by_tokens": {"1": [3.0]}}, "must map batch sizes to"),
    ({"draft_extend_us_by_batch": {"0": 3.0}}, "draft_extend_us_by_batch must map batch sizes .>= 1."),
    ({"deployment": {"num_layers": 8, "tp": 2}}, "deployment must be an object with some of"),
    ({"deployment": {"num_layers": 0}}, "deployment.num_layers must be a positive integer"),
])
def test_bad_verify_inputs(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(content))
    with pytest.raises(LabError, match=match):
        apply_inputs(PRESETS[SEEDS], f)


def test_bench_verify_bad_arguments(random_llama, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "verify", "--target", str(random_llama), "--tokens", "0,2"])
    assert e.value.code == 2 and "expected positive integers" in capsys.readouterr().err
    assert main(["bench", "verify", "--target", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and len(err.strip().splitlines()) == 1
    # past the target's positions: a RuntimeError allocating the dense mask (40 GB at --context 100000)
    assert main(["bench", "verify", "--target", str(random_llama), "--context", "1020", "--tokens", "5"]) == 2
    assert capsys.readouterr().err == (f"error: {random_llama}: --context 1020 plus 5 tokens is 1025 positions, past "
                                       "the target's max_position_embeddings 1024\n")


def test_a_falling_fit_gives_no_per_token_cost():
    """Noise can tilt the fit down; its negative per-token cost was printed as the value to give
    `costmodel --verify-token-compute-us`, which refuses it."""
    from drafter_lab.spec.bench_verify import format_table

    table = {1: {1: 3.0, 5: 2.9}}
    assert "per further token" in format_table(table, {}, {}, (3.0, 0.01, 0.0), 8)
    text = format_table(table, {}, {}, (3.0, -0.02, 0.01), 8)
    assert "--verify-token-compute-us" not in text and "no per-token cost" in text
