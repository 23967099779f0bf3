"""The verify-step cost model reproduces the seeds and reads measured inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import apply_inputs, predicted_by_steps
from drafter_lab.spec.costmodel import PRESETS, CostModel, interpolate_latency, latency_at
from drafter_lab.spec.costreport import report, settings_table, steps_table
from drafter_lab.train.metrics import summarize
from drafter_lab.train.metrics_log import BEST_DIR, BEST_FILE, METRICS, MetricsLog
from drafter_lab.train.ttt import COND_DEN, COND_NUM, N_COLS

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_preset_reproduces_the_seeds():
    m = CostModel(PRESETS[SEEDS])
    assert m.spec_tok_s(2.0) == pytest.approx(60, rel=0.15)
    assert m.spec_tok_s(1.5) == pytest.approx(52, rel=0.15)
    assert m.baseline_tok_s() == pytest.approx(82, rel=1e-6)
    assert m.verify_ms() == pytest.approx(30, rel=0.05)
    assert m.n_allreduce == 122
    assert m.n_allreduce * PRESETS[SEEDS].verify_allreduce_us / 1000 == pytest.approx(25, rel=0.05)
    assert m.draft_ms == pytest.approx(0.66)


def test_break_even_is_where_speculation_matches_decoding():
    m = CostModel(PRESETS[SEEDS])
    a = m.break_even()
    assert 2.0 < a < 3.0  # the seeds: accept 2.0 was slower than plain decoding
    assert m.spec_tok_s(a) == pytest.approx(m.baseline_tok_s())
    # a faster all-reduce moves break-even down (draft and overhead then weigh more), and helps
    # the decode step only where it is faster than the decode's own all-reduce
    assert m.break_even(40.0) < m.break_even(8.0) < 1.5 < a
    assert m.baseline_tok_s(200.0) == pytest.approx(m.baseline_tok_s())
    assert m.baseline_tok_s(8.0) > m.baseline_tok_s()


def test_cycles_without_drafts_run_as_plain_decode_steps(tmp_path):
    """Half the cycles draft nothing (n-gram lookup without a match): N cycles emit A x N tokens in
    N/2 verify cycles plus N/2 decode steps, and break-even is where that matches plain decoding."""
    cfg = dataclasses.replace(PRESETS[SEEDS], no_draft_share=0.5)
    m, always = CostModel(cfg), CostModel(PRESETS[SEEDS])
    for x in (None, 15.0):
        per_cycle = (always.cycle_ms(x) + always.decode_ms(x)) / 2
        assert m.spec_tok_s(2.0, x) == pytest.approx(2000 / per_cycle)
        assert m.spec_tok_s(m.break_even(x), x) == pytest.approx(m.baseline_tok_s(x))
        assert 1 < m.break_even(x) < always.break_even(x)
    path = tmp_path / "ngram.json"
    path.write_text(json.dumps({"served_accept_len": 1.6, "no_draft_share": 0.25, "draft_step_us": 3.0}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], path)
    assert (cfg.no_draft_share, cfg.draft_step_us) == (0.25, 3.0)
    path.write_text(json.dumps({"no_draft_share": 0}))  # a lookup that always matched
    assert apply_inputs(PRESETS[SEEDS], path)[0].no_draft_share == 0
    path.write_text(json.dumps({"no_draft_share": 1.0}))
    with pytest.raises(LabError, match=r"no_draft_share must be a number in \[0, 1\), got 1.0"):
        apply_inputs(PRESETS[SEEDS], path)
    with pytest.raises(LabError, match=r"no_draft_share must be in \[0, 1\), got -0.5"):
        CostModel(dataclasses.replace(PRESETS[SEEDS], no_draft_share=-0.5))


def test_measured_inputs(tmp_path):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"allreduce_us": {"8192": 9.2, "32768": 16.5, "65536": 25.9},
                             "draft_step_us": 100.0, "accept_length": 2.2, "table": [1, 2]}))
    cfg, measured = apply_inputs(PRESETS[SEEDS], f)
    assert cfg.draft_step_us == 100.0
    assert 2.2 in cfg.accept_lengths
    # a 56 KiB verify message lies between the 32 and 64 KiB points
    assert 16.5 < latency_at(measured, CostModel(cfg).message_bytes) < 25.9
    r = report(cfg, measured)
    assert r["whatif"][-1]["allreduce"].startswith("measured")
    assert interpolate_latency({8: 1.0, 32: 3.0}, 16) == pytest.approx(2.0)
    # below the table a message costs the smallest's latency; beyond it, bandwidth: twice the bytes, twice the time
    assert interpolate_latency({8: 1.0, 32: 3.0}, 2) == 1.0 and interpolate_latency({8: 1.0, 32: 3.0}, 64) == 6.0


def test_verify_ms_input_sets_compute(tmp_path, capsys):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"verify_ms": 40.0}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], f)
    assert CostModel(cfg).verify_ms() == pytest.approx(40.0)
    # the compute is derived from the whole deployment, flags included: the measured verify holds
    # whatever layers or all-reduce latency they give, and the what-if tables still move it
    for flags in (["--num-layers", "30"], ["--verify-allreduce-us", "100"], ["--decode-allreduce-us", "10"]):
        out = tmp_path / "cm.json"
        assert main(["costmodel", "--inputs", str(f), *flags, "--json", str(out)]) == 0
        r = json.loads(out.read_text())
        assert r["verify_ms"] == pytest.approx(40.0)
        assert r["whatif"][-1]["verify_ms"] < 40.0
    # a decode step the preset's all-reduces do not fit, mended by a flag, in one file with the verify
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"decode_ms": 5.0, "verify_ms": 30.0}))
    assert main(["costmodel", "--inputs", str(both), "--decode-allreduce-us", "10", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["verify_ms"] == pytest.approx(30.0)
    # a flag for the per-layer compute wins over a file's measured verify
    assert main(["costmodel", "--inputs", str(f), "--verify-layer-compute-us", "50", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["verify_ms"] == pytest.approx(61 * 50 / 1000 + 122 * 0.205)
    capsys.readouterr()
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"verify_ms": 1.0}))
    assert main(["costmodel", "--inputs", str(short)]) == 2
    err = capsys.readouterr().err
    assert "shorter than its 122 all-reduces" in err and str(short) in err


@pytest.mark.parametrize("flag, value, match", [
    ("--cycle-overhead-ms", "-100", "--cycle-overhead-ms must be a finite number >= 0"),
    ("--decode-ms", "nan", "--decode-ms must be a finite number > 0"),
    ("--num-layers", "0", "--num-layers must be a finite number > 0"),
    ("--accept-lengths", "0", "--accept-lengths must hold finite numbers > 0"),
    ("--accept-lengths", "", "--accept-lengths is empty"),  # printed a table with no row
    ("--batches", "1,,8", "--batches: an empty item in '1,,8'"),  # was read as 1,8
    ("--steps", "0", "--steps must be a finite number > 0"),
    ("--draft-step-us", "-5", "--draft-step-us must be a finite number > 0"),
    ("--verify-allreduce-us", "inf", "--verify-allreduce-us must be a finite number >= 0"),
])
def test_a_flag_out_of_range_is_refused(flag, value, match, capsys):
    """Each printed tables of negative or NaN tok/s."""
    assert main(["costmodel", flag, value]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    ('{"other": 1}', "no cost model inputs"),
    ('{"draft_step_us": -3}', "positive number"),
    ('{"verify_ms": -1.0}', "positive number"),
    ('{"allreduce_us": {"big": 3}}', "message sizes"),
    ('{"accept_histogram": {"1": 0, "2": 0}}', "no verify steps"),
    ('{"accept_histogram": [1, 2]}', "must map"),
    ('{"accept_histogram": {"1": 1.7, "2": 0.6}}', "counts must be whole numbers"),  # read as {1: 1, 2: 0}
    ('{"deployment": {"allreduces_per_layer": false}}', "deployment.allreduces_per_layer must be a positive integer"),
    # each of these was a traceback (ZeroDivisionError, ValueError, AttributeError) or a negative cost
    ('{"allreduce_us": {"0": 10}}', r"message sizes in bytes \(>= 1\)"),
    ('{"allreduce_us": {"-4096": 10}}', r"message sizes in bytes \(>= 1\)"),
    ('{"served_accept_len": 2.5, "config": {"steps": 4, "batch": "x"}}', "config.batch must be a positive integer"),
    ('{"served_accept_len": 2.5, "config": {"steps": 4, "topk": 1.5}}', "config.topk must be a positive integer"),
    ('{"served_accept_len": 2.5, "config": "chain"}', "config must be an object"),
    ('{"served_accept_len": 2.5, "config": {"steps": -3}}', "config.steps must be a positive integer, got -3"),
])
def test_bad_inputs(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(LabError, match=match):
        apply_inputs(PRESETS[SEEDS], f)


def test_cli(tmp_path, capsys):
    out = tmp_path / "cm.json"
    assert main(["costmodel", "--json", str(out), "--steps", "4"]) == 0
    text = capsys.readouterr().out
    assert "break-even served accept length" in text
    for x in ("200 us", "40 us", "25 us", "15 us", "8 us"):
        assert x in text
    data = json.loads(out.read_text())
    assert data["config"]["steps"] == 4
    assert data["break_even_accept_len"] > 2
    assert main(["costmodel", "--inputs", str(tmp_path / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_bad_inputs_file_given_bare_is_named_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{bad")
    assert main(["costmodel", "--inputs", "bad.json"]) == 2
    assert capsys.readouterr().err.startswith("error: bad.json: not valid JSON (")


def test_an_inconsistent_deployment_names_the_inputs_that_made_it(tmp_path, capsys):
    """A decode step shorter than the preset's all-reduces is only wrong beside them: the error
    names both, and a flag that mends it is taken."""
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"decode_ms": 1.0}))
    assert main(["costmodel", "--inputs", str(short)]) == 2
    err = capsys.readouterr().err
    assert "take longer than the whole decode step" in err and f"{SEEDS} + {short}" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["costmodel", "--inputs", str(short), "--decode-allreduce-us", "5"]) == 0


def test_draft_steps_from_an_eval_histogram(tmp_path):
    """At 2 steps, 2 verify steps emitted 1 token, 1 emitted 2 and 1 emitted 3: one step deep, the last
    would have emitted 2. Each step deeper costs a draft step and one more verify token on the wire."""
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"served_accept_len": 1.75, "accept_histogram": {"1": 2, "2": 1, "3": 1},
                             "config": {"steps": 2, "topk": 1}}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], f)
    assert cfg.accept_by_steps == [1.5, 1.75] and 1.75 in cfg.accept_lengths
    # the measured 1.75 is priced at the 2 steps and 3 verified tokens it was measured with
    assert (cfg.steps, cfg.verify_tokens) == (2, 3)
    f.write_text(json.dumps({"served_accept_len": 2.5, "config": {"steps": 4, "topk": 2, "draft_tokens": 8}}))
    tree, _ = apply_inputs(PRESETS[SEEDS], f)
    assert (tree.steps, tree.verify_tokens) == (4, 9)
    rows = steps_table(cfg)
    m = CostModel(PRESETS[SEEDS])
    for row, (steps, accept) in zip(rows, [(1, 1.5), (2, 1.75)]):
        cycle = m.verify_ms() + steps * cfg.draft_step_us / 1000 + cfg.cycle_overhead_ms
        assert row["cycle_ms"] == pytest.approx(cycle)
        assert row["spec_tok_s"] == pytest.approx(1000 * accept / cycle)
    # With a measured table, each depth's all-reduce is looked up at its own message size.
    table = {8192: 9.0, 131072: 17.0}
    sized = steps_table(cfg, table)
    assert [r["allreduce_us"] for r in sized] == [latency_at(table, t * 7168 * 2) for t in (2, 3)]
    assert sized[0]["allreduce_us"] < sized[1]["allreduce_us"]
    r = report(cfg, table)
    assert r["best_steps"] == max(sized, key=lambda row: row["spec_tok_s"])  # priced at the measured all-reduce
    assert r["whatif"][-1]["best_steps"] == max(sized, key=lambda row: row["spec_tok_s"])



def test_a_validation_predicts_the_accept_length_at_every_depth():
    """Draft k is accepted when drafts 0..k are all right: 1 + 0.8, + 0.8 * 0.5, + 0.8 * 0.5 * 0.25."""
    assert predicted_by_steps({"cond_acc_0": 0.8, "cond_acc_1": 0.5, "cond_acc_2": 0.25, "acc_3": 0.9}) == \
        pytest.approx([1.8, 2.2, 2.3])
    g = torch.Generator().manual_seed(0)
    for _ in range(5):  # at the TTT depth: the simulated accept length plus the bonus token, on fresh counts
        counts = torch.rand(5, N_COLS, generator=g, dtype=torch.float64) * 100
        counts[:, COND_NUM] = counts[:, COND_DEN] * torch.rand(5, generator=g, dtype=torch.float64)
        row = summarize(counts)
        assert predicted_by_steps(row)[-1] == pytest.approx(1 + row["simulated_accept_len"], rel=1e-12)


def test_a_training_run_prices_its_drafter_before_any_decode(tmp_path, capsys):
    run = tmp_path / "run"
    log = MetricsLog(run / METRICS)
    run.mkdir()
    log.write({"split": "train", "step": 2, "cond_acc_0": 0.1})
    log.write({"split": "val", "step": 2, "cond_acc_0": 0.5, "cond_acc_1": 0.5})
    log.write({"split": "val", "step": 4, "cond_acc_0": 0.8, "cond_acc_1": 0.5})  # the last validation counts
    cfg, _ = apply_inputs(PRESETS[SEEDS], run)
    assert cfg.accept_by_steps == pytest.approx([1.8, 2.2]) and len(steps_table(cfg)) == 2
    assert "served accept lengths predicted from the validation at step 4" in " ".join(capsys.readouterr().err.split())
    best = run / BEST_DIR  # train --keep-best's drafter: the kept validation, not the last one
    best.mkdir()
    (best / BEST_FILE).write_text(json.dumps({"metric": "cond_acc_0", "value": 0.9, "step": 3,
                                              "validation": {"step": 3, "cond_acc_0": 0.9}}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], best)
    assert cfg.accept_by_steps == pytest.approx([1.9])
    (best / BEST_FILE).write_text(json.dumps({"metric": "cond_acc_0"}))
    with pytest.raises(LabError, match="best.json holds no validation"):
        apply_inputs(PRESETS[SEEDS], best)
    (tmp_path / "starting").mkdir()
    MetricsLog(tmp_path / "starting" / METRICS).write({"split": "train", "step": 1, "cond_acc_0": 0.1})
    for where, match in ((tmp_path / "starting", "has not validated yet"), (tmp_path, "neither a training run")):
        with pytest.raises(LabError, match=match):
            apply_inputs(PRESETS[SEEDS], where)
    f = tmp_path / "given.json"  # the same key in an inputs file
    f.write_text(json.dumps({"accept_by_steps": [1.7, 2.1, 2.3]}))
    assert apply_inputs(PRESETS[SEEDS], f)[0].accept_by_steps == [1.7, 2.1, 2.3]
    f.write_text(json.dumps({"accept_by_steps": [1.7, 2.1], "accept_histogram": {"1": 1, "2": 1}}))
    assert apply_inputs(PRESETS[SEEDS], f)[0].accept_by_steps == [1.7, 2.1]  # the list given, not the histogram's
    f.write_text(json.dumps({"accept_by_steps": []}))
    with pytest.raises(LabError, match="must be a list of served accept lengths"):
        apply_inputs(PRESETS[SEEDS], f)


@pytest.mark.parametrize("topk, what", [(4, "tree drafting (topk 4)"), (None, "drafting of unknown topk")])
def test_a_tree_evals_histogram_gives_no_draft_steps_table(tmp_path, capsys, topk, what):
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"served_accept_len": 2.5, "accept_histogram": {"1": 1, "2": 1, "3": 2},
                             "config": {"steps": 2, "topk": topk}}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], f)
    assert cfg.accept_by_steps == [] and 2.5 in cfg.accept_lengths and steps_table(cfg) == []
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"its accept histogram comes from {what}; the draft-steps table needs a chain" in err


def test_plot_draws_the_models_numbers(tmp_path):
    from PIL import Image

    from drafter_lab.spec.costplot import series

    cfg = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.4, 2.9])
    table = {8192: 10.0, 65536: 14.0}
    # A flag's all-reduce prices the deployment: the measured table is one what-if among the rest.
    assert [s["label"] for s in series(cfg, measured=table, priced=False)] == [
        "205 us (this deployment)", "200 us", "40 us", "25 us", "15 us", "8 us", "measured 13.7 us"]
    lines = series(cfg, measured=table)  # as the text report: the measured table is the deployment's
    assert [s["label"] for s in lines] == ["measured 13.7 us (this deployment)", "205 us (the preset)", "200 us", "40 us",
                                           "25 us", "15 us", "8 us"]  # 57,344-byte messages, log-interpolated
    lines = lines[1:] + lines[:1]
    m = CostModel(cfg)
    for s, latency in zip(lines, [205.0, 200.0, 40.0, 25.0, 15.0, 8.0, table]):
        assert s["accept"][0] == 1.0 and s["accept"][-1] == pytest.approx(4.0 + 1.0)  # up to the largest asked + 1
        assert s["spec_tok_s"][10] == pytest.approx(m.spec_tok_s(s["accept"][10], latency))
        assert s["break_even"] == pytest.approx(m.break_even(latency))
        assert s["baseline_tok_s"] == m.baseline_tok_s(latency)
        assert [r["steps"] for r in s["steps"]] == [1, 2, 3]
    # the table prices the decode step's own 14,336-byte messages, not the verify's
    decode = m.decode_compute_ms + 122 * interpolate_latency(table, 14336) / 1000
    assert lines[-1]["baseline_tok_s"] == pytest.approx(1000 / decode) and decode < m.decode_ms(13.7)
    assert main(["costmodel", "--accept-by-steps", "1.8,2.4,2.9", "--plot", str(tmp_path / "cm.png")]) == 0
    with Image.open(tmp_path / "cm.png") as im:
        assert im.format == "PNG" and im.size[0] > 1000  # two panels


def test_verify_compute_can_grow_with_the_tokens_verified():
    """An MoE verify reads more experts per token: each token beyond the preset's 4 adds 5 us a layer,
    each one fewer saves it, in the draft-steps table and the settings rows alike."""
    flat = dataclasses.replace(PRESETS[SEEDS], accept_by_steps=[1.8, 2.4, 2.9, 3.2])
    moe = dataclasses.replace(flat, verify_token_compute_us=5.0)
    assert CostModel(moe).verify_ms() == CostModel(flat).verify_ms()  # at its own 4 tokens
    for f, m in zip(steps_table(flat), steps_table(moe)):
        extra = 61 * 5.0 * (f["steps"] + 1 - 4) / 1000
        assert m["verify_ms"] == pytest.approx(f["verify_ms"] + extra)
    tree = {"served_accept_len": 3.0, "config": {"steps": 4, "topk": 2, "draft_tokens": 12}}
    (f,), (m,) = settings_table(flat, [tree]), settings_table(moe, [tree])
    assert m["verify_ms"] == pytest.approx(f["verify_ms"] + 61 * 5.0 * 9 / 1000) and m["spec_tok_s"] < f["spec_tok_s"]
    with pytest.raises(LabError, match="verify compute per layer at 2 tokens comes to -18 us"):
        steps_table(dataclasses.replace(moe, verify_token_compute_us=50.0))


def test_a_flag_for_the_per_token_compute_prices_an_evals_verify_as_its_sweep_row(tmp_path):
    """An eval that verified 13 tokens, priced with 5 us a layer per token beyond the preset's 4: the
    same verify whether the eval comes alone or as a one-row sweep, and whichever way the flag and the
    files meet (the flag is applied after them)."""
    ev = {"served_accept_len": 3.19, "config": {"steps": 4, "topk": 2, "draft_tokens": 12, "batch": 1}}
    (tmp_path / "ev.json").write_text(json.dumps(ev))
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": [ev]}))
    flag = ["--verify-token-compute-us", "5", "--json"]
    assert main(["costmodel", "--inputs", str(tmp_path / "ev.json"), *flag, str(tmp_path / "a.json")]) == 0
    assert main(["costmodel", "--inputs", str(tmp_path / "sweep.json"), *flag, str(tmp_path / "b.json")]) == 0
    alone = json.loads((tmp_path / "a.json").read_text())
    (row,) = json.loads((tmp_path / "b.json").read_text())["settings"]
    flat = CostModel(dataclasses.replace(PRESETS[SEEDS], verify_tokens=13)).verify_ms()
    assert alone["verify_ms"] == pytest.approx(flat + 61 * 5.0 * 9 / 1000) == pytest.approx(row["verify_ms"])


def test_a_batch_scales_every_sequences_work():
    """B sequences: tok/s counts all of them. With flat compute and one latency the ratio does not move;
    with per-token compute the verify (B x 4 tokens) grows 4x faster than the decode step (B tokens),
    and break-even rises with B."""
    flat = PRESETS[SEEDS]
    one = CostModel(flat)
    for b in (2, 8):
        m = CostModel(dataclasses.replace(flat, batch=b))
        assert m.spec_tok_s(2.5) == pytest.approx(b * one.spec_tok_s(2.5))
        assert m.baseline_tok_s() == pytest.approx(b * one.baseline_tok_s())
        assert m.break_even() == pytest.approx(one.break_even())
    moe = dataclasses.replace(flat, verify_token_compute_us=5.0)
    m1, m8 = CostModel(moe), CostModel(dataclasses.replace(moe, batch=8))
    assert m8.verify_ms() == pytest.approx(m1.verify_ms() + 61 * 5.0 * 7 * 4 / 1000)
    assert m8.decode_ms() == pytest.approx(m1.decode_ms() + 61 * 5.0 * 7 / 1000)
    assert m1.break_even() < m8.break_even()
    # a measured table is read at the batch's own messages: 8 x 4 and 8 x 1 tokens of 7168 bf16
    table = {8192: 10.0, 1 << 20: 100.0}
    assert m8.verify_ms(table) == pytest.approx(m8.verify_compute_ms + 122 * interpolate_latency(table, 8 * 4 * 14336) / 1000)
    assert m8.decode_ms(table) == pytest.approx(m8.decode_compute_ms + 122 * interpolate_latency(table, 8 * 14336) / 1000)
    with pytest.raises(LabError, match="batch must be a finite number > 0, got 0"):
        CostModel(dataclasses.replace(flat, batch=0))


def test_draft_step_by_batch_is_interpolated():
    cfg = dataclasses.replace(PRESETS[SEEDS], draft_step_us_by_batch={1: 700.0, 8: 980.0, 32: 1100.0})
    at = {b: CostModel(dataclasses.replace(cfg, batch=b)).draft_step_us for b in (1, 4, 8, 20, 64)}
    assert at == pytest.approx({1: 700.0, 4: 820.0, 8: 980.0, 20: 1040.0, 64: 1260.0})  # 64: the last segment on
    assert CostModel(cfg).draft_ms == pytest.approx(3 * 0.7)  # not draft_step_us, once measured by batch
    # a tree's draft step runs topk rows per sequence
    assert CostModel(dataclasses.replace(cfg, batch=4, topk=2)).draft_step_us == pytest.approx(980.0)


def test_batch_inputs_and_table(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"draft_step_us": 700.0, "draft_step_us_by_batch": {"1": 700.0, "8": 980.0}}))
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"served_accept_len": 2.6, "config": {"steps": 3, "topk": 1, "draft_tokens": 3,
                                                                    "batch": 4}}))
    cfg, _ = apply_inputs(PRESETS[SEEDS], bench)
    cfg, _ = apply_inputs(cfg, ev)
    assert cfg.batch == 4 and CostModel(cfg).draft_step_us == pytest.approx(820.0)  # priced at its own batch
    out = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(bench), "--inputs", str(ev), "--batches", "1,8,32",
                 "--verify-token-compute-us", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(batch 4: tok/s counts all 4 sequences)" in text and "batch: the same drafting with B sequences" in text
    r = json.loads(out.read_text())
    rows = r["batch_table"]
    assert [row["batch"] for row in rows] == [1, 8, 32]
    for row in rows:
        m = CostModel(dataclasses.replace(cfg, batch=row["batch"], verify_token_compute_us=3.0))
        assert row["spec_tok_s"]["2.6"] == pytest.approx(m.spec_tok_s(2.6))
        assert row["baseline_tok_s"] == pytest.approx(m.baseline_tok_s())
    assert rows[0]["break_even_accept_len"] < rows[1]["break_even_accept_len"] < rows[2]["break_even_accept_len"]
    assert r["spec_tok_s"]["2.6"] == pytest.approx(CostModel(dataclasses.replace(cfg, verify_token_compute_us=3.0))
                                                   .spec_tok_s(2.6))
    bench.write_text(json.dumps({"draft_step_us_by_batch": [700.0]}))
    assert main(["costmodel", "--inputs", str(bench)]) == 2
    err = capsys.readouterr().err
    assert "draft_step_us_by_batch must map batch sizes to microseconds" in err and str(bench) in err
