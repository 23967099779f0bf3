"""The cost model's arithmetic against hand-computed numbers: a tree's draft time and a sweep row
whose eval did not say its topk; its inputs refused with one line where they cannot be what they
claim (a tp-sim JSON keyed by backend, an accept histogram deeper than its steps, an accept length
below 1); one all-reduce in every figure of a report."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import accept_by_steps
from drafter_lab.spec.costmodel import PRESETS, CostModel, latency_at
from drafter_lab.spec.costreport import settings_table

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_a_trees_first_draft_runs_one_row_per_sequence():
    """Batch 4, topk 2, 3 steps, a draft-step table {1: 700, 8: 980, 32: 1100} us and no extend table: the
    first draft (the extend) runs the 4 roots, 820 us; the 2 later steps 8 rows, 980 us each: 2.78 ms
    (3 x 980 = 2.94 ms charged the roots' step at 8 rows). A chain, or a flat step, is unchanged."""
    table = {1: 700.0, 8: 980.0, 32: 1100.0}
    tree = CostModel(dataclasses.replace(PRESETS[SEEDS], batch=4, topk=2, steps=3, draft_step_us_by_batch=table))
    assert tree.draft_step_us == pytest.approx(980.0)
    assert tree.draft_ms == pytest.approx((820.0 + 2 * 980.0) / 1000)
    chain = CostModel(dataclasses.replace(tree.cfg, topk=1))
    assert chain.draft_ms == pytest.approx(3 * 820.0 / 1000)
    flat = CostModel(dataclasses.replace(PRESETS[SEEDS], batch=4, topk=2))
    assert flat.draft_ms == pytest.approx(3 * 220.0 / 1000)
    # with an extend table the first draft is the extend at the batch (900 + 3 x 50 us), as before
    extended = CostModel(dataclasses.replace(tree.cfg, draft_extend_us_by_batch={1: 900.0, 8: 1250.0}))
    assert extended.draft_ms == pytest.approx((1050.0 + 2 * 980.0) / 1000)


def test_the_printed_draft_line_adds_up_for_a_tree(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"draft_step_us": 700.0, "draft_step_us_by_batch": {"1": 700.0, "8": 980.0}}))
    assert main(["costmodel", "--inputs", str(bench), "--batch", "4", "--topk", "2"]) == 0
    assert "draft    = 820 us + 2 steps x 980 us = 2.78 ms" in capsys.readouterr().out


def test_a_sweep_row_without_a_topk_is_priced_as_a_chain(tmp_path, capsys):
    """A served eval whose server did not report its topk (config.topk null) is drafted as a chain; its
    row printed that null and the report died in a TypeError."""
    row = {"served_accept_len": 2.5, "config": {"steps": 3, "topk": None, "draft_tokens": None}}
    (priced,) = settings_table(PRESETS[SEEDS], [row])
    assert priced["topk"] == 1 and priced["draft_tokens"] == 3
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"sweep": [row]}))
    assert main(["costmodel", "--inputs", str(sweep)]) == 0
    assert "--speculative-eagle-topk 1" in capsys.readouterr().out


def test_a_tp_sim_json_names_the_per_backend_files_to_pass(tmp_path, capsys):
    """`bench allreduce --tp-sim`'s main JSON keys verify_ms and allreduce_us by backend: it was refused
    as "verify_ms must be a positive number, got {'none': ...}"."""
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps({"allreduce_us": {"cpu": {"14336": 27.1}, "gloo": {"14336": 270.9}},
                               "verify_ms": {"none": {"1": 1.6}, "cpu": {"1": 2.9}, "gloo": {"1": 16.3}}}))
    for b in ("cpu", "gloo"):
        (tmp_path / f"sim.costmodel-{b}.json").write_text(json.dumps({"allreduce_us": {"14336": 27.1}}))
    assert main(["costmodel", "--inputs", str(sim)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(sim) in err and "must be a positive number" not in err
    assert f"{tmp_path / 'sim.costmodel-cpu.json'} or {tmp_path / 'sim.costmodel-gloo.json'}" in err
    (tmp_path / "sim.costmodel-cpu.json").unlink()
    (tmp_path / "sim.costmodel-gloo.json").unlink()
    assert main(["costmodel", "--inputs", str(sim)]) == 2
    assert "sim.costmodel-<backend>.json (none there)" in capsys.readouterr().err


def test_an_accept_histogram_deeper_than_its_steps_is_refused(tmp_path, capsys):
    """A served length counts the bonus token: at most steps + 1. One of 9 at 2 steps drove the draft-steps
    table to "best: 8 steps"; without steps, a length of 1e9 hung building the table."""
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"served_accept_len": 2.0, "accept_histogram": {"1": 5, "9": 3},
                              "config": {"steps": 2, "topk": 1}}))
    assert main(["costmodel", "--inputs", str(ev)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(ev) in err and "served accept length of 9, above config.steps + 1 = 3" in err
    assert accept_by_steps({"1": 5, "3": 3}, ev, steps=2) == pytest.approx([1.375, 1.75])
    assert len(accept_by_steps({"65": 1}, ev)) == 64  # no steps given: up to 64 draft steps
    with pytest.raises(LabError, match="served accept length of 1000, above 65"):
        accept_by_steps({"1000": 1}, ev)


@pytest.mark.parametrize("flags, given, message", [
    (["--accept-by-steps", "0.5"], None, "--accept-by-steps must be at least 1"),
    (["--accept-lengths", "0.5,2"], None, "--accept-lengths must be at least 1"),
    ([], {"accept_length": 0.5}, "accept_length must be at least 1"),
    ([], {"accept_by_steps": [1.5, 0.9]}, r"accept_by_steps\[1\] must be at least 1"),
    ([], {"served_accept_len": 0.8, "config": {"steps": 3}}, "served_accept_len must be at least 1"),
])
def test_a_served_accept_length_below_one_is_refused(tmp_path, capsys, flags, given, message):
    """A served accept length counts the bonus token, so it is at least 1; 0.5 printed a table."""
    f = tmp_path / "in.json"
    if given is not None:
        f.write_text(json.dumps(given))
        flags = ["--inputs", str(f)]
    assert main(["costmodel", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err)
    assert (str(f) in err) == (given is not None)


def test_every_figure_prices_the_measured_allreduce(tmp_path, capsys):
    """An all-reduce table from --inputs priced the batch table while the headline, break-even and draft
    steps stayed at the preset's 205 us: batch 1's verify read 8.5 ms, the headline's 30.0."""
    table = {"14336": 27.1, "57344": 28.8}
    ar = tmp_path / "ar.json"
    ar.write_text(json.dumps({"allreduce_us": table}))
    out = tmp_path / "cm.json"
    argv = ["costmodel", "--inputs", str(ar), "--batches", "1,4", "--accept-by-steps", "1.8,2.4", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    one = r["batch_table"][0]
    assert one["batch"] == 1
    at = latency_at({int(k): v for k, v in table.items()}, 4 * 7168 * 2)
    assert r["verify_ms"] == pytest.approx(one["verify_ms"]) == pytest.approx(61 * 0.082 + 122 * at / 1000)
    for key in ("decode_ms", "baseline_tok_s", "break_even_accept_len", "spec_tok_s"):
        assert r[key] == pytest.approx(one[key])
    assert r["best_steps"] == r["whatif"][-1]["best_steps"]  # the measured what-if row is the headline's
    assert f"122 all-reduces x {at:.3g} us (measured) = {r['verify_ms']:.2f} ms" in text
    assert "the measured all-reduce at each depth's message" in text
    # a --verify-allreduce-us flag is the deployment's; the file's table is its what-if row only
    assert main([*argv, "--verify-allreduce-us", "15"]) == 0
    capsys.readouterr()
    r = json.loads(out.read_text())
    assert r["verify_ms"] == pytest.approx(r["batch_table"][0]["verify_ms"]) == pytest.approx(61 * 0.082 + 122 * 0.015)
    assert r["whatif"][-1]["allreduce"].startswith("measured")


def test_a_deployment_without_allreduces_says_nothing_of_them(tmp_path, capsys):
    """`bench verify` prices one device: 0 all-reduces, which the headline called "59 us each"."""
    one = tmp_path / "verify.json"
    one.write_text(json.dumps({"deployment": {"allreduces_per_layer": 0}, "decode_ms": 10.0}))
    assert main(["costmodel", "--inputs", str(one), "--accept-by-steps", "1.8,2.4"]) == 0
    head, steps = capsys.readouterr().out.split("what-if:")
    assert "all-reduce" not in head
    assert "all-reduce" not in steps.split("draft steps")[1].splitlines()[0]
