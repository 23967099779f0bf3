"""Review s68 (h6) of `eval`'s sweep and `costmodel --inputs`: a value given twice to a sweep flag, an
accept_by_steps list of any length, a sweep file with other inputs beside it, and a sweep row whose ratio
is null; and pins from the mutation audit of spec/sweep.py and spec/costinputs.py."""

from __future__ import annotations

import json

import pytest

from drafter_lab.journal import Journal
from drafter_lab.spec.costinputs import apply_inputs
from drafter_lab.spec.costmodel import MAX_DRAFT_STEPS, PRESETS
from drafter_lab.spec.sweep import format_sweep, grid, run_sweep

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_a_sweep_value_given_twice_is_one_setting_refused_as_a_plain_eval(prompts_file, tmp_path, cli_error):
    """--steps 2,2 made one setting a sweep: two "leaving out" lines, then "no setting of the sweep can be
    drafted" instead of the reason, naming the flag. Refused before the target loads (there is none here)."""
    err = cli_error(["eval", "--ngram", "--target", str(tmp_path / "none"), "--prompts", str(prompts_file),
                     "--steps", "2,2", "--topk", "2", "--draft-tokens", "8"])
    assert err == "error: --draft-tokens must be in 1..6 for steps=2, topk=2, got 8"


def test_a_sweep_value_given_twice_leaves_a_setting_out_once(capsys):
    assert grid([2, 3], [2, 2], [7, 7]) == [{"steps": 3, "topk": 2, "draft_tokens": 7, "batch": 1}]
    assert capsys.readouterr().err.count("sweep: leaving out steps 2, topk 2, draft tokens 7") == 1


def _inputs(tmp_path, data) -> str:
    f = tmp_path / "inputs.json"
    f.write_text(json.dumps(data))
    return str(f)


def test_accept_by_steps_longer_than_any_engine_drafts_is_refused_naming_the_file(tmp_path, cli_error):
    """Every depth was priced, once per what-if row too: a million-entry list ran for most of an hour."""
    f = _inputs(tmp_path, {"accept_by_steps": [1.5] * (MAX_DRAFT_STEPS + 1)})
    assert cli_error(["costmodel", "--inputs", f]) == (
        f"error: {f}: accept_by_steps lists 65 depths, above the 64 draft steps any engine drafts")
    f = _inputs(tmp_path, {"accept_by_steps": [1.5] * MAX_DRAFT_STEPS})
    assert len(apply_inputs(PRESETS[SEEDS], f)[0].accept_by_steps) == MAX_DRAFT_STEPS


def test_a_sweep_file_with_other_inputs_beside_it_is_refused_naming_the_file(tmp_path, cli_error):
    """The sweep's rows were priced and the file's decode_ms and all-reduce silently dropped."""
    row = {"served_accept_len": 2.0, "config": {"steps": 2, "topk": 1, "draft_tokens": 2}}
    f = _inputs(tmp_path, {"sweep": [row], "decode_ms": 5.0, "allreduce_us": 9.0})
    assert cli_error(["costmodel", "--inputs", f]) == (
        f"error: {f}: holds \"sweep\" (an eval sweep's rows) beside allreduce_us, decode_ms: an `eval` sweep's "
        "JSON holds \"sweep\" alone; give the other inputs in a file of their own")


def _row(steps, speedup, batch=1, spec=10.0):
    return {"config": {"steps": steps, "topk": 1, "draft_tokens": steps, "batch": batch}, "served_accept_len": 1.5,
            "spec_tok_s": spec, "baseline_tok_s": 8.0, "speedup": speedup}


def test_a_sweep_row_with_a_null_ratio_prints_a_dash_and_is_no_candidate():
    """A NaN the journal or JSON kept as null printed "-x", and beside a priced row raised a TypeError."""
    text = format_sweep([_row(2, 1.25), _row(3, None, spec=None), _row(4, None, batch=8), _row(5, None, batch=8)])
    rows = [line.split() for line in text.splitlines() if " | " in line][1:]
    assert [r[-4:] for r in rows] == [["10.0", "8.0", "1.25x", "-"], ["-", "8.0", "-", "-"],
                                      ["10.0", "8.0", "-", "-"], ["10.0", "8.0", "-", "-"]]
    assert "fastest here at batch 1: steps 2, topk 1, draft tokens 2" in text
    assert "at batch 8" not in text and "None" not in text  # nothing priced at batch 8: nothing to choose


def test_a_journal_record_whose_setting_lists_its_keys_in_another_order_is_not_decoded_again(tmp_path):
    """A setting is the same whatever order its keys were written in (a hand-edited or older journal line)."""
    path = tmp_path / "sweep.json.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"setting": {"batch": 1, "draft_tokens": 2, "topk": 1, "steps": 2}, "result": {"n": 7}})
    setting = {"steps": 2, "topk": 1, "draft_tokens": 2, "batch": 1}
    with Journal(path, {"seed": 1}) as journal:
        assert run_sweep([setting], lambda s: pytest.fail("decoded again"), journal) == [{"n": 7}]


def test_a_bench_allreduce_latency_table_is_refused_for_the_backend_files_beside_it(tmp_path, cli_error):
    """`bench allreduce --json`'s table keys allreduce_us by "<N> ranks, <backend>" and has no verify_ms: it
    must be refused as a by-backend result (naming the files to pass), not as a table of bad message sizes."""
    table = tmp_path / "lat.json"
    table.write_text(json.dumps({"allreduce_us": {"2 ranks, ours": {"8192": 6.1}}, "meta": {}}))
    beside = tmp_path / "lat.costmodel-ours-2ranks.json"
    beside.write_text(json.dumps({"allreduce_us": {"8192": 6.1}}))
    assert cli_error(["costmodel", "--inputs", str(table)]) == (
        f"error: {table}: a `bench allreduce` result, its timings by backend: pass one backend's file written beside "
        f"it instead: {beside}")


def test_an_allreduce_table_may_start_at_a_one_byte_message(tmp_path):
    """Message sizes >= 1 are taken: the boundary of the "keys must be message sizes in bytes (>= 1)" refusal."""
    f = _inputs(tmp_path, {"allreduce_us": {"1": 5.0, "1024": 8.0}})
    assert apply_inputs(PRESETS[SEEDS], f)[1] == {1: 5.0, 1024: 8.0}


def test_accept_by_steps_given_as_a_flag_is_bounded_too(cli_error):
    """The flag priced each of its depths as a file's list did."""
    err = cli_error(["costmodel", "--accept-by-steps", ",".join(["1.5"] * (MAX_DRAFT_STEPS + 1))])
    assert err == f"error: --accept-by-steps lists {MAX_DRAFT_STEPS + 1} depths, above the {MAX_DRAFT_STEPS} draft " \
                  "steps any engine drafts"
