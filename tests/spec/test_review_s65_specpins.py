"""What no test pinned in the sweep, n-gram forgetting, accept statistics, drafter/target pairing and the
eval command's flags and reports (found by a hand mutation audit): each test fails on a plausible slip
in the code it names."""

from __future__ import annotations

import argparse
import copy
import json
import math
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.spec.accept import accept_summary, greedy_walk
from drafter_lab.spec.commands import (
    _histogram_lines,
    _latency_lines,
    _ngram_drafter,
    _pooled,
    _prompt_sets,
    _set_line,
    format_served,
    int_list,
    rate_list,
)
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.pairing import check_pair, load_for_target
from drafter_lab.spec.sweep import format_sweep, grid, run_sweep
from drafter_lab.spec.tree import padded_tree
from drafter_lab.targets.hf import default_aux_layer_ids


def test_accept_summary_counts_every_length_up_to_the_longest():
    s = accept_summary([1, 3, 3, 5], 5)
    assert s["served_accept_len"] == 3.0 and s["verify_steps"] == 4
    # the longest a step can emit has its own bin, and lengths never seen are 0, not missing
    assert s["histogram"] == {"1": 1, "2": 0, "3": 2, "4": 0, "5": 1}
    empty = accept_summary([], 3)
    assert math.isnan(empty["served_accept_len"]) and empty["verify_steps"] == 0  # no step: no mean, not 0


def test_histogram_lines_give_each_lengths_share_of_the_steps():
    assert _histogram_lines({"1": 1, "2": 3}) == ["histogram (served accept length: share of verify steps):",
                                                  "   1:  25.0% " + "#" * 10, "   2:  75.0% " + "#" * 30]
    assert _histogram_lines({"1": 0})[1] == "   1:   0.0% "  # no step: no division by zero


def test_run_sweep_resumes_in_the_given_order_and_journals_what_it_decodes(tmp_path):
    path = tmp_path / "sweep.json.partial"
    settings = [{"steps": s} for s in (2, 4, 6)]
    with Journal(path, {"seed": 0}) as journal:
        assert run_sweep(settings[1:2], lambda s: {"got": s["steps"]}, journal) == [{"got": 4}]
    decoded = []

    def decode(s):
        decoded.append(s["steps"])
        return {"got": s["steps"]}

    with Journal(path, {"seed": 0}) as journal:
        # the journaled setting is not decoded again, and results come back in the settings' order
        assert run_sweep(settings, decode, journal) == [{"got": 2}, {"got": 4}, {"got": 6}]
    assert decoded == [2, 6]
    assert [r["setting"]["steps"] for r in Journal(path, {"seed": 0}).records] == [4, 2, 6]


def test_grid_drops_duplicate_settings_and_a_chains_tree_budget():
    # 4 as the budget of both a chain and a tree: the chain's row is its own steps, once
    assert grid([4, 4], [1, 2], [4, 8]) == [{"steps": 4, "topk": 1, "draft_tokens": 4, "batch": 1},
                                            {"steps": 4, "topk": 2, "draft_tokens": 4, "batch": 1},
                                            {"steps": 4, "topk": 2, "draft_tokens": 8, "batch": 1}]
    assert grid([2], [1], None, [8, 8, 1]) == [{"steps": 2, "topk": 1, "draft_tokens": 2, "batch": b} for b in (8, 1)]


def _row(steps, topk, speedup=None, batch=1, **extra):
    r = {"config": {"steps": steps, "topk": topk, "draft_tokens": steps * topk, "batch": batch},
         "served_accept_len": 2.0, "spec_tok_s": 10.0, **extra}
    return r if speedup is None else {**r, "speedup": speedup, "baseline_tok_s": 10.0 / speedup}


def test_format_sweep_names_the_fastest_setting_at_each_batch():
    rows = [_row(2, 1, 1.5), _row(4, 1, 2.5), _row(2, 1, 1.2, batch=8), _row(4, 1, 0.9, batch=8)]
    lines = format_sweep(rows).splitlines()
    assert lines[-3:] == ["fastest here at batch 1: steps 4, topk 1, draft tokens 4",
                          "fastest here at batch 8: steps 2, topk 1, draft tokens 2",
                          "(this machine's speed; `costmodel --inputs` prices the settings on a deployment)"]
    assert format_sweep(rows[:2]).splitlines()[-2] == "fastest here: steps 4, topk 1, draft tokens 4"


def test_format_sweep_of_one_drafting_names_no_fastest_and_a_served_sweep_no_machine():
    # one drafting at two batches: nothing to choose between
    one = format_sweep([_row(2, 1, 1.5), _row(2, 1, 1.1, batch=8)])
    assert "fastest" not in one and one.endswith("on a deployment)")
    served = format_sweep([_row(2, 1, 1.5, server="http://s"), _row(4, 1, 2.0, server="http://s")])
    assert served.splitlines()[-1] == "fastest here: steps 4, topk 1, draft tokens 4"
    # a row without a target-only tok/s: no ratio, no fastest, the hint
    partial = format_sweep([_row(2, 1, 1.5), _row(4, 1)])
    assert "fastest" not in partial and partial.endswith("pass --baseline-server for the ratio)")


@pytest.mark.parametrize("text", ["1,inf", "nan", "0", "-2"])
def test_request_rate_takes_positive_finite_numbers(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected positive finite requests per second"):
        rate_list(text)
    assert rate_list("0.5,8") == [0.5, 8.0]
    assert int_list("1,16") == [1, 16]


def _pair(vocab=10, hidden=4, d2t=None, t2d=None, fc_in=None, aux=(1, 2, 3)):
    target = SimpleNamespace(vocab_size=vocab, hidden_size=hidden, num_layers=6)
    cfg = SimpleNamespace(target_vocab_size=vocab, target_hidden_size=hidden, aux_layer_ids=list(aux))
    d2t = torch.zeros(3, dtype=torch.long) if d2t is None else d2t
    drafter = SimpleNamespace(config=cfg, t2d=torch.ones(vocab if t2d is None else t2d, dtype=torch.bool), d2t=d2t,
                              fc=SimpleNamespace(weight=torch.zeros(hidden, 3 * hidden if fc_in is None else fc_in)))
    return target, drafter


@pytest.mark.parametrize("kw, said", [
    ({"t2d": 9}, "t2d has 9 entries, the target has 10 tokens"),
    ({"fc_in": 8}, "fc takes 8, the target gives 3 x 4 = 12"),
    ({"d2t": torch.tensor([0, 0, 8])}, "target ids 0..10, outside the target's 0..9"),  # draft id 2 -> 10: one past
    ({"d2t": torch.tensor([-1, 0, 0])}, "target ids -1..2, outside"),
])
def test_check_pair_refuses_tensors_that_do_not_fit_naming_the_drafter(kw, said):
    target, drafter = _pair(**kw)
    with pytest.raises(LabError, match=said) as e:
        check_pair(target, drafter, "d/")
    assert e.value.path == "d/"


def test_check_pair_takes_the_last_target_id_and_fills_default_aux_layers():
    target, drafter = _pair(d2t=torch.tensor([0, 0, 7]), aux=())  # draft id 2 -> target id 9, the last of 10
    check_pair(target, drafter, "d/")
    assert drafter.config.aux_layer_ids == default_aux_layer_ids(6)


def test_rows_forgotten_stay_forgotten_once_new_rows_finish():
    """After `forget` (a measurement's start) only rows finished since are looked up: the warm-up's rows
    must not come back once a measured row has finished."""
    d = NgramDrafter(NgramConfig(2, 3, across_prompts=True))
    d.finish([[7, 1, 2, 3, 4]])
    d.forget()
    d.finish([[5, 6, 8]])
    d.reset(1)
    assert d.continuations(d.rows[0], [9, 1, 2], 4, 2) == []
    assert d.continuations(d.rows[0], [9, 1, 2, 0, 5, 6], 4, 2) == [[8]]
    assert d.earlier.row_ends == [3] and d.earlier.tokens == [5, 6, 8]


def _prompts(path, n):
    turns = [{"conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
             for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def test_prompt_sets_cut_to_max_prompts_and_keep_two_files_of_one_stem(tmp_path):
    a, b = _prompts(tmp_path / "x" / "chat.jsonl", 3), _prompts(tmp_path / "y" / "chat.jsonl", 1)
    sets = _prompt_sets(SimpleNamespace(prompts=[str(a), str(b)], max_prompts=2))
    # the second file of a stem is named by its path, not written over the first
    assert {name: (path, len(convs)) for name, (path, convs) in sets.items()} == {"chat": (str(a), 2),
                                                                                  str(b): (str(b), 1)}


def test_eval_refuses_negative_threads_before_loading_the_target(tmp_path, capsys):
    """torch.set_num_threads(-1) would fail past the flag's name."""
    prompts = _prompts(tmp_path / "p.jsonl", 1)
    assert main(["eval", "--ngram", "--target", str(tmp_path / "missing"), "--prompts", str(prompts),
                 "--threads", "-1"]) == 2
    assert capsys.readouterr().err == "error: --threads must be >= 0, got -1\n"


@pytest.mark.parametrize("field, said", [
    ("target_vocab_size", "its t2d maps a 11-token vocab, the target has 10 tokens"),
    ("target_hidden_size", "fc takes 3 x 5, the target's hidden states are 4 wide"),
])
def test_check_pair_refuses_a_config_that_does_not_fit(field, said):
    target, drafter = _pair()
    setattr(drafter.config, field, getattr(drafter.config, field) + 1)
    with pytest.raises(LabError, match=said) as e:
        check_pair(target, drafter, "d/")
    assert e.value.path == "d/"


def test_greedy_walk_path_is_root_first_and_one_column_per_level():
    tree = padded_tree(torch.tensor([9, 9]), [[(1, 0), (2, 1)], [(1, 0), (2, 1)]], pad_id=0)
    logits = torch.zeros(2, 3, 8)
    logits[0, [0, 1, 2], [1, 2, 5]] = 1  # row 0: both drafts accepted, 5 at the last node
    logits[1, [0, 1, 2], [1, 3, 6]] = 1  # row 1: the first, then 3 instead of 2
    path, counts, bonus = greedy_walk(tree, logits)
    assert path.tolist() == [[0, 1, 2], [0, 1, -1]]
    assert counts.tolist() == [3, 2] and bonus.tolist() == [5, 3]


def test_a_served_sweep_over_request_rates_shows_each_rows_rate():
    rows = [{**_row(0, 0, 1.5, server="http://s"), "in_flight": {"spec": 3.6}} for _ in range(2)]
    for r, rate in zip(rows, (2.0, 0.5)):
        r["config"] = {"steps": None, "topk": None, "draft_tokens": None, "request_rate": rate}
    head, _, *cells = format_sweep(rows).splitlines()
    assert head.split("|")[0].split() == ["steps", "topk", "draft", "tokens", "batch", "req/s"]
    # the batch a rate's row is priced at is the mean the server carried
    assert [c.split("|")[0].split() for c in cells[:2]] == [["-", "-", "-", "4", "2"], ["-", "-", "-", "4", "0.5"]]


def test_one_prompt_set_is_its_own_result_not_a_pool():
    r = {"served_accept_len": 2.0, "prompts_file": "a.jsonl"}
    assert _pooled({"a": r}) is r


def test_a_local_eval_refuses_the_served_evals_engine(tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", 1)
    assert main(["eval", "--ngram", "--target", str(tmp_path / "missing"), "--prompts", str(prompts),
                 "--engine", "vllm"]) == 2
    assert capsys.readouterr().err.startswith("error: --baseline-server, --engine, --model, --concurrency")


def test_a_drafter_saved_without_aux_layer_ids_loads_with_the_default(target, random_drafter, tmp_path):
    """A checkpoint (e.g. a speculators export) that records no aux layers decodes from [2, L//2, L-3]."""
    drafter = copy.deepcopy(random_drafter)
    drafter.config.aux_layer_ids = []
    out = save_drafter(drafter, tmp_path / "d")
    assert load_for_target(out, target).config.aux_layer_ids == default_aux_layer_ids(target.num_layers)


def test_set_line_gives_the_sets_numbers_and_its_ratio_when_measured():
    r = {"prompts": 3, "served_accept_len": 2.25, "verify_steps": 40, "spec_tok_s": 120.04}
    assert _set_line("chat", r) == "set chat: 3 prompts, served accept 2.250 over 40 verify steps, spec 120.0 tok/s"
    assert _set_line("chat", {**r, "speedup": 1.456}).endswith("spec 120.0 tok/s, 1.46x")


def _served(**over):
    side = {"ttft_ms": {"median": 10.0, "p90": 20.0}, "tpot_ms": {"median": 2.0, "p90": 3.0}}
    r = {"config": {"max_new_tokens": 8, "temperature": 0.0, "concurrency": 4, "request_rate": None, "seed": 3},
         "engine": "sglang", "server": "http://s", "server_settings": {"speculative_num_steps": 3}, "prompts": 5,
         "served_accept_len": 2.5, "verify_steps": 16, "accept_histogram": None, "spec_tok_s": 50.0,
         "requests": {"spec": {"chunks": [4, 6]}, "baseline": {"chunks": [0]}}, "in_flight": {"spec": 3.5, "baseline": None},
         "latency": {"spec": side, "baseline": side, "tpot_speedup": None}, "spec_tokens": 40, "baseline_tokens": 0}
    return {**r, **over}


def test_format_served_without_a_baseline_server():
    assert format_served(_served()).splitlines() == [
        "sglang server http://s (num_steps 3): 5 prompts x 8 new tokens, temperature 0, 4 in flight at most",
        "served accept length: 2.500 tokens per verify step (bonus included), 16 verify steps",
        "tok/s: speculative 50.0 (no --baseline-server to compare with)",
        "requests in flight on average: speculative 3.50",
        "per request, ms (speculative / baseline server): TTFT median 10.00 / 10.00, p90 20.00 / 20.00; "
        "TPOT median 2.00 / 2.00, p90 3.00 / 3.00",
        "streamed tokens per event: speculative 4.00"]


def test_format_served_at_a_rate_against_a_baseline_server():
    r = _served(config={**_served()["config"], "request_rate": 2.5}, server_settings={}, baseline_tok_s=40.0,
                speedup=1.25, lossless_check="identical", in_flight={"spec": 3.5, "baseline": 2.25},
                requests={"spec": {"chunks": [4, 6]}, "baseline": {"chunks": [20]}}, baseline_tokens=40,
                accept_histogram={"1": 1, "2": 3})
    lines = format_served(r).splitlines()
    assert lines[0] == ("sglang server http://s (no speculative settings reported): 5 prompts x 8 new tokens, "
                        "temperature 0, 4 in flight at most, arriving at 2.5 per second (Poisson, seed 3)")
    assert lines[2:5] == _histogram_lines({"1": 1, "2": 3})
    assert lines[5:] == ["tok/s: speculative 50.0, baseline server 40.0, ratio 1.25x",
                         "greedy outputs against the baseline server: identical",
                         "requests in flight on average: speculative 3.50, baseline server 2.25", lines[8],
                         "streamed tokens per event: speculative 4.00, baseline server 2.00"]


def test_format_sweep_row_cells_carry_their_units():
    row = {**_row(4, 2, 1.5), "latency": {"tpot_speedup": 1.234}}
    cells = format_sweep([row, _row(2, 1, 1.1)]).splitlines()[2:4]
    assert cells[0].split("|")[1].split() == ["2.000", "10.0", "6.7", "1.50x", "1.23x"]
    assert cells[1].split("|")[1].split() == ["2.000", "10.0", "9.1", "1.10x", "-"]  # no TPOT measured: no ratio
    assert cells[0].split("|")[0].split() == ["4", "2", "8", "1"]


def test_latency_line_says_how_much_faster_per_token_when_measured():
    side = {"ttft_ms": {"median": 10.0, "p90": None}, "tpot_ms": {"median": 2.0, "p90": 3.0}}
    lat = {"spec": side, "baseline": side, "tpot_speedup": 1.5}
    assert _latency_lines(lat) == ["per request, ms (speculative / target only): TTFT median 10.00 / 10.00, p90 - / -; "
                                   "TPOT median 2.00 / 2.00, p90 3.00 / 3.00 (1.50x faster per token)"]


def test_a_prompts_file_with_a_repeated_conversation_says_what_it_skipped(tmp_path, capsys):
    path = _prompts(tmp_path / "p.jsonl", 2)
    path.write_text(path.read_text() + path.read_text().splitlines(keepends=True)[0])
    sets = _prompt_sets(SimpleNamespace(prompts=[str(path)], max_prompts=None))
    assert len(sets["p"][1]) == 2
    err = capsys.readouterr().err
    assert "p.jsonl: skipped" in err and "duplicate_id" in err


def test_ngram_flags_make_the_drafter():
    args = SimpleNamespace(fused="auto", allow_other_target=False, ngram_min=1, ngram_max=None,
                           ngram_across_prompts=True)
    assert _ngram_drafter(args).cfg == NgramConfig(1, NgramConfig.max_n, across_prompts=True)
