"""The cost model against hand-computed numbers where a measured verify meets a measured all-reduce."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.costplot import series
from drafter_lab.train.metrics_log import METRICS, MetricsLog

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def _inputs(tmp_path, **files) -> list[str]:
    argv = []
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        argv += ["--inputs", str(tmp_path / f"{name}.json")]
    return argv


def test_a_measured_verify_is_split_at_the_measured_allreduce(tmp_path, capsys):
    """A 30 ms verify of 4 tokens and an all-reduce table measured on the same box (28.8 us at the verify's
    4 x 7168 x 2 = 57,344 bytes): compute 30 - 122 x 0.0288 = 26.4864 ms, and the headline verify is the
    measured 30 ms. It was split at the preset's 205 us (compute 4.99 ms) and priced at 8.50 ms."""
    argv = _inputs(tmp_path, verify={"verify_ms": 30.0}, ar={"allreduce_us": {"14336": 27.1, "57344": 28.8}})
    out = tmp_path / "cm.json"
    sweep_row = {"served_accept_len": 3.0, "config": {"steps": 4, "topk": 1, "draft_tokens": 4}}
    argv += _inputs(tmp_path, sweep={"sweep": [sweep_row]})
    assert main(["costmodel", *argv, "--accept-by-steps", "1.8,2.4", "--json", str(out)]) == 0
    capsys.readouterr()
    r = json.loads(out.read_text())
    compute = 30.0 - 122 * 0.0288
    assert r["verify_ms"] == pytest.approx(30.0)
    assert r["layer_compute_us"] == pytest.approx(1000 * compute / 61)
    # the 200 us what-if: the same compute with 122 all-reduces of 200 us
    (w200,) = [w for w in r["whatif"] if w["allreduce"] == "200 us"]
    assert w200["verify_ms"] == pytest.approx(compute + 122 * 0.200)
    # the draft-steps table at 1 step: 2 tokens, a 28,672-byte message, log-interpolated in the table
    at2 = 27.1 + (28.8 - 27.1) * 0.5  # 28,672 is halfway between 14,336 and 57,344 in log size
    assert r["steps_table"][0]["verify_ms"] == pytest.approx(compute + 122 * at2 / 1000)
    # the sweep row at 5 tokens: 71,680 bytes, past the table, grows with the bytes
    (row,) = r["settings"]
    assert row["verify_ms"] == pytest.approx(compute + 122 * 28.8 * 71680 / 57344 / 1000)
    # the plot's bold line is the report's deployment
    cfg, _ = apply_inputs(PRESETS[SEEDS], tmp_path / "verify.json")
    cfg, table = apply_inputs(cfg, tmp_path / "ar.json")
    lines = series(cfg, table)
    assert lines[0]["label"].endswith("(this deployment)")
    assert lines[0]["break_even"] == pytest.approx(r["break_even_accept_len"])
    assert lines[0]["baseline_tok_s"] == pytest.approx(r["baseline_tok_s"])


def test_a_fast_measured_allreduce_prices_a_short_measured_verify(tmp_path, capsys):
    """NVLink-like: a 10 ms verify and 40 us all-reduces. It was refused ("shorter than its 122 all-reduces
    of 205 us") though the file gives the deployment's all-reduce. Compute 10 - 122 x 0.04 = 5.12 ms; the
    decode takes the faster 40 us too: 1000/82 - 122 x 0.059 + 122 x 0.040 = 9.8771 ms; cycle 0.66 + 10 +
    0.43 = 11.09 ms, break-even 11.09 / 9.8771."""
    argv = _inputs(tmp_path, verify={"verify_ms": 10.0}, ar={"allreduce_us": 40})
    out = tmp_path / "cm.json"
    assert main(["costmodel", *argv, "--json", str(out)]) == 0
    capsys.readouterr()
    r = json.loads(out.read_text())
    decode = 1000 / 82 - 122 * 0.059 + 122 * 0.040
    assert r["verify_ms"] == pytest.approx(10.0)
    assert r["decode_ms"] == pytest.approx(decode)
    assert r["cycle_ms"] == pytest.approx(11.09)
    assert r["spec_tok_s"]["2"] == pytest.approx(2000 / 11.09)
    assert r["break_even_accept_len"] == pytest.approx(11.09 / decode)
    # with the flag the flag prices it, the file is a what-if row: unchanged
    assert main(["costmodel", *argv, "--verify-allreduce-us", "40", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["verify_ms"] == pytest.approx(10.0)
    # a measured verify shorter than the measured all-reduces is still refused in one line
    argv = _inputs(tmp_path, verify={"verify_ms": 4.0}, ar={"allreduce_us": 40})
    capsys.readouterr()
    assert main(["costmodel", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shorter than its 122 all-reduces of 40 us (measured)" in err


@pytest.mark.parametrize("sampled", [False, True])
def test_a_validation_that_scored_no_position_predicts_nothing(tmp_path, capsys, sampled):
    """A validation with no scored position logs cond_acc_k (and replay_accept_len_k) of 0.0: the run was
    priced as a drafter accepting 1.00 token per verify at every depth (exit 0), or refused as
    "accept_by_steps must hold finite numbers > 0" with --sampled. It measured nothing: refused, naming it."""
    run = tmp_path / "run"
    run.mkdir()
    MetricsLog(run / METRICS).write({
        "split": "val", "step": 4, "positions": 0, "cond_acc_0": 0.0, "cond_acc_1": 0.0, "simulated_accept_len": 0.0,
        "sampled_acc_0": 0.0, "sampled_acc_1": 0.0, "replay_accept_len_0": 0.0, "replay_accept_len_1": 0.0})
    argv = ["costmodel", "--inputs", str(run), *(["--sampled"] if sampled else [])]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "its validation at step 4 scored no position" in err and str(run) in err
    with pytest.raises(LabError, match="scored no position"):
        apply_inputs(PRESETS[SEEDS], run)
    # a validation that scored positions still predicts: 1 + 0.8, + 0.8 x 0.5
    MetricsLog(run / METRICS).write({"split": "val", "step": 6, "positions": 120, "cond_acc_0": 0.8, "cond_acc_1": 0.5})
    assert apply_inputs(PRESETS[SEEDS], run)[0].accept_by_steps == pytest.approx([1.8, 2.2])


def test_a_bad_flag_beside_a_measured_verify_and_allreduce_is_refused_in_one_line(tmp_path, capsys):
    argv = _inputs(tmp_path, verify={"verify_ms": 30.0}, ar={"allreduce_us": 40})
    assert main(["costmodel", *argv, "--num-layers", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --num-layers must be a finite number > 0, got 0\n"  # the flag, before the inputs are read
