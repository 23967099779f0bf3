"""Review s60: the lab's JSON files and lines are strict JSON (an undefined metric is null, not the NaN that
jq, JSON.parse, Go and serde_json refuse), and their readers take that null as the NaN they read before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from drafter_lab import atomic
from drafter_lab.cli import main
from drafter_lab.train.metrics_log import MetricsLog, read_metrics


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def strict(text: str):
    """json.loads as a strict parser reads: NaN, Infinity and -Infinity refused."""
    return json.loads(text, parse_constant=_refuse)


def strict_file(path: Path) -> None:
    text = path.read_text()
    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    for i, line in enumerate(lines, 1):
        try:
            strict(line)
        except ValueError as e:
            pytest.fail(f"{path} line {i}: {e}")


def test_a_run_whose_losses_are_undefined_writes_strict_json_and_reads_them_as_nan(random_llama, stdlib_features,
                                                                                   tmp_path, capsys):
    """Cut to 4 tokens no sequence reaches an answer: every loss_k (and weighted_loss) is NaN. metrics.jsonl
    held NaN; they hold null, and read_metrics gives NaN back, as the watch expects."""
    out = tmp_path / "run"
    assert main(["train", "--target", str(random_llama), "--data", str(stdlib_features), "--out", str(out),
                 "--draft-vocab-size", "64", "--epochs", "1", "--max-length", "4", "--threads", "1",
                 "--keep-best", "cond_acc_0"]) == 0
    printed = strict(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["loss_0"] is None
    files = sorted(p for p in out.rglob("*") if p.suffix in (".json", ".jsonl"))
    assert {"metrics.jsonl", "run.json"} <= {p.name for p in files}
    for path in files:
        strict_file(path)
    # a validation that scored no position is no best (it kept the step-2 drafter as "best cond_acc_0=0")
    assert not (out / "best").exists()

    val = [r for r in read_metrics(out) if r["split"] == "val"]
    assert val and all(math.isnan(r["loss_0"]) and math.isnan(r["weighted_loss"]) for r in val)
    assert all(r["positions"] == 0 and r["cond_acc_0"] == 0.0 for r in val)  # numbers stay numbers
    # the watch compares a loss only where one was measured: a null read as such was "not a number"
    capsys.readouterr()
    assert main(["watch", str(out), "--baseline", str(out), "--watch-metric", "loss_0", "--json"]) == 0
    assert strict(capsys.readouterr().out.strip().splitlines()[-1])["stop"] is False


def test_write_json_writes_null_for_each_non_finite_float_at_any_depth(tmp_path):
    obj = {"a": math.nan, "b": [1.5, math.inf, (-math.inf, 2)], "c": {"d": {"e": math.nan}}, "n": 3, "t": True,
           "s": "NaN", "none": None}
    atomic.write_json(tmp_path / "x.json", obj)
    assert strict((tmp_path / "x.json").read_text()) == {
        "a": None, "b": [1.5, None, [None, 2]], "c": {"d": {"e": None}}, "n": 3, "t": True, "s": "NaN", "none": None}
    assert atomic.dumps({"x": float("nan")}, sort_keys=True) == '{"x": null}'


def test_a_metrics_line_round_trips_nan_and_inf_as_nan(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "split": "val", "loss_0": math.nan, "loss_1": math.inf, "acc_0": 0.5, "positions": 0})
    strict_file(tmp_path / "metrics.jsonl")
    (row,) = read_metrics(tmp_path)
    assert math.isnan(row["loss_0"]) and math.isnan(row["loss_1"])
    assert (row["step"], row["split"], row["acc_0"], row["positions"]) == (1, "val", 0.5, 0)


def test_the_study_reads_an_arm_history_with_a_null_loss_as_nan(tmp_path):
    """The report replays the watch over each arm's history: a null loss was 'not a number' there."""
    from drafter_lab.experiments.study import _read_history
    from drafter_lab.train.watch import WatchConfig, replay

    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step, loss in ((0, 3.0), (2, math.nan), (4, 2.5)):
        log.write({"event": "val", "split": "val", "step": step, "loss_0": loss, "positions": 5})
    rows = _read_history(tmp_path / "metrics.jsonl")
    assert math.isnan(rows[1]["loss_0"])
    assert replay(rows, rows, WatchConfig(watch_metric="loss_0", watch_window=1), 4) is None


def test_reproduce_takes_a_null_metric_for_the_nan_an_older_results_json_holds():
    """A results.json written now holds null where one written before held NaN: undefined in both, no
    difference; a null CKA was a TypeError (\"not a study's results\")."""
    from drafter_lab.experiments.reproduce import compare, flat_metrics

    def results(undefined):
        return {"levels": [{
            "drift_knob": 1.0,
            "pair": {"drift_figures": {"all": {"kl": 0.1, "cka": [undefined, 0.9]}}},
            "arms": [{"key": "a", "final": {"step": 3, "loss_0": undefined, "cond_acc_0": 0.5},
                      "served": {"served_accept_len": undefined, "verify_steps": 0}}],
            "probe": {"zero_shot": {"loss_0": undefined}, "aux_cka": [undefined], "verdict": "x"},
        }]}

    old, new = flat_metrics(results(math.nan)), flat_metrics(results(None))
    assert set(old) == set(new) and "drift 1 / arm a / loss_0" in new
    assert compare(old, new) == [] and compare(new, new) == []
    changed = dict(new, **{"drift 1 / arm a / loss_0": 2.0})
    assert [k for k, _, _ in compare(new, changed)] == ["drift 1 / arm a / loss_0"]


def test_a_pair_with_a_nan_cka_prints_its_drift_table(tmp_path, capsys):
    """A CKA of no variance is NaN: build.json and pair.json hold null, which the table formatted as a number."""
    from drafter_lab.targets.build import _read_record
    from drafter_lab.targets.commands import print_drift

    fig = {"cka": [math.nan, 0.5], "kl": 0.1, "base_nll": 2.0, "tuned_nll": 2.1, "tokens": 8}
    atomic.write_json(tmp_path / "pair.json", {
        "drift": 1.0, "drift_figures": {k: fig for k in ("all", "base_text", "shifted_text")},
        "build_seconds": {"this_call": 0.1},
        "base": {"fingerprint": "b", "params": 1, "cached": True}, "tuned": {"fingerprint": "t", "cached": True}})
    strict_file(tmp_path / "pair.json")
    pair = _read_record(tmp_path / "pair.json")
    assert math.isnan(pair["drift_figures"]["all"]["cka"][0]) and pair["drift_figures"]["all"]["tokens"] == 8
    print_drift(pair)
    assert "nan" in capsys.readouterr().out
