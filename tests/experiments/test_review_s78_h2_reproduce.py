"""Review s78 (h2) of reproduce: which recorded values flat_metrics reads as metrics (numbers, and nulls
as NaN), that a served record older than one of its fields is still compared, and the CLI's "absent" for
a metric the re-run no longer writes."""

from __future__ import annotations

import json
import math

from drafter_lab.experiments import reproduce as reproduce_mod
from drafter_lab.experiments.reproduce import flat_metrics


def _level(final: dict, **parts) -> dict:
    return {"drift_knob": 1.0, "arms": [{"key": "a", "final": final, **parts.pop("arm", {})}],
            "probe": {"zero_shot": {"cond_acc_0": 0.1}, "verdict": "train from scratch", **parts.pop("probe", {})},
            **parts}


def test_a_null_metric_is_read_as_nan_and_a_field_that_is_no_number_is_left_out():
    """results.json holds a NaN metric as null (atomic.finite): it is compared as the NaN it was. A string
    or flag beside the metrics is no measurement."""
    got = flat_metrics({"levels": [_level({"step": 3, "loss_1": None, "note": "resumed", "early": True})]})
    loss = got.pop("drift 1 / arm a / loss_1")
    assert type(loss) is float and math.isnan(loss)
    assert got == {"drift 1 / arm a / step": 3, "drift 1 / probe zero-shot / cond_acc_0": 0.1,
                   "drift 1 / probe verdict": "train from scratch"}


def test_a_null_aux_cka_of_the_probe_is_read_as_nan():
    """A CKA without variance is NaN, written as null: not a results.json of another shape."""
    got = flat_metrics({"levels": [_level({}, probe={"aux_cka": [0.75, None]})]})
    assert got["drift 1 / probe / aux cka 0"] == 0.75 and math.isnan(got["drift 1 / probe / aux cka 1"])


def test_a_served_record_older_than_one_of_its_fields_is_compared_without_it():
    """A run recorded before the served evaluation wrote lossless_check (or a histogram) still reproduces:
    the fields it holds are compared, the missing one is simply not there."""
    served = {"served_accept_len": 1.5, "verify_steps": 10, "spec_tokens": 30, "baseline_tokens": 30}
    got = flat_metrics({"levels": [_level({}, arm={"served": served})]})
    assert {k: v for k, v in got.items() if "/ served /" in k} == {
        "drift 1 / arm a / served / served_accept_len": 1.5, "drift 1 / arm a / served / verify_steps": 10,
        "drift 1 / arm a / served / spec_tokens": 30, "drift 1 / arm a / served / baseline_tokens": 30}


def test_the_cli_names_a_metric_the_rerun_no_longer_writes_as_absent(tmp_path, monkeypatch, capsys):
    from drafter_lab.cli import main

    orig = tmp_path / "orig"
    orig.mkdir()
    manifest = {"config": {"name": "smoke"}}
    for name, value in (("manifest.json", manifest),
                        ("results.json", {"levels": [_level({"cond_acc_0": 0.5, "loss_1": 2.0})]})):
        (orig / name).write_text(json.dumps(value))

    def rerun(cfg, runs_root, cache, run_dir, command):  # the study alone is faked: its results lack loss_1
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
        (run_dir / "results.json").write_text(json.dumps({"levels": [_level({"cond_acc_0": 0.5})]}))
        return run_dir

    monkeypatch.setattr(reproduce_mod, "run_study", rerun)
    assert main(["reproduce", str(orig), "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "cache")]) == 1
    rows = [" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines()]
    assert "drift 1 / arm a / loss_1 2.0 absent" in rows
