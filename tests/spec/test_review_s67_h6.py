"""Bad-input sweep (review s67, h6) of `costmodel` and `eval`: integers past float's range in a flag or an
inputs file, a config that is no object, a replay that ran no verify step, a file given twice, and server
answers whose counts are no counts each end in one line naming the flag, file or endpoint, where they ended in
a traceback or passed; a served decode starts no more request slots than it has prompts."""

from __future__ import annotations

import json
import re
import threading

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.served import acceptance, vllm_answer, vllm_counters

HUGE = 10 ** 400  # JSON and int() read it; float() of it, math.isfinite included, raised an OverflowError


@pytest.mark.parametrize("flag", ["--num-layers", "--hidden-size", "--batch", "--batches"])
def test_a_flag_integer_past_floats_range_is_refused_in_one_line(cli_error, flag):
    err = cli_error(["costmodel", flag, str(HUGE)])
    assert err.startswith(f"error: {flag} must ")


@pytest.mark.parametrize("inputs, match", [
    ({"served_accept_len": HUGE}, "served_accept_len must be a positive number"),
    ({"deployment": {"num_layers": HUGE}}, "deployment.num_layers must be a positive integer"),
    ({"served_accept_len": 2.0, "config": {"steps": HUGE}}, "config.steps must be a positive integer"),
    ({"served_accept_len": 2.0, "config": {"steps": 3, "request_rate": 1.0}, "in_flight": {"spec": HUGE}},
     "a served eval at a request rate needs in_flight.spec"),
    ({"accept_histogram": {"1": HUGE}}, "accept_histogram counts must be whole numbers"),
    ({"draft_step_us_by_batch": {str(HUGE): 5.0}}, r"draft_step_us_by_batch must map batch sizes \(>= 1\)"),
    ({"verify_ms_by_tokens": {"1": {str(HUGE): 5.0}}}, r"verify_ms_by_tokens must map batch sizes \(>= 1\)"),
    ({"sweep": [{"served_accept_len": 2.0, "config": {"steps": 2, "topk": HUGE}}]},
     "config.topk must be a positive integer"),
], ids=["accept", "deployment", "steps", "in-flight", "histogram", "batch-key", "tokens-key", "sweep-topk"])
def test_an_inputs_integer_past_floats_range_is_refused_naming_the_file(tmp_path, cli_error, inputs, match):
    f = tmp_path / "inputs.json"
    f.write_text(json.dumps(inputs))
    err = cli_error(["costmodel", "--inputs", str(f)])
    assert err.startswith(f"error: {f}: ") and re.search(match, err), err


def test_a_run_validation_integer_past_floats_range_is_refused_naming_the_file(tmp_path, cli_error):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": 10, "cond_acc_0": HUGE}) + "\n")
    err = cli_error(["costmodel", "--inputs", str(run)])
    metrics = run / "metrics.jsonl"
    assert err.startswith(f"error: {metrics}: its validation at step 10 has cond_acc_0 1000"), err


@pytest.mark.parametrize("config", [[], 0, ""], ids=["list", "zero", "empty-text"])
def test_an_eval_config_that_is_no_object_is_refused_even_when_falsy(tmp_path, cli_error, config):
    """`config or {}` read [], 0 and "" as an eval without settings, priced at the preset's."""
    f = tmp_path / "eval.json"
    f.write_text(json.dumps({"served_accept_len": 2.0, "config": config}))
    assert cli_error(["costmodel", "--inputs", str(f)]) == (
        f"error: {f}: config must be an object (an eval's settings), got {config!r}")


@pytest.mark.parametrize("meta, name", [
    ({"completion_tokens": 9, "spec_verify_ct": "4"}, "meta_info.spec_verify_ct '4'"),  # int() took it
    ({"completion_tokens": 9, "spec_verify_ct": [4]}, "meta_info.spec_verify_ct [4]"),  # TypeError
    ({"completion_tokens": 9, "spec_verify_ct": 2.5}, "meta_info.spec_verify_ct 2.5"),  # cut to 2
    ({"completion_tokens": 9, "spec_verify_ct": 4, "spec_accept_histogram": [1, None, 3]},
     "meta_info.spec_accept_histogram None"),  # TypeError
    ({"completion_tokens": 9, "spec_verify_ct": 4, "spec_accept_histogram": [-1, 5]},
     "meta_info.spec_accept_histogram -1"),  # a negative bar
    ({"completion_tokens": 9, "spec_verify_ct": 4, "spec_accept_histogram": [float("inf"), 4]},
     "meta_info.spec_accept_histogram inf"),  # JSON's Infinity: int()'s OverflowError
], ids=["text", "list", "fraction", "null-bar", "negative-bar", "inf-bar"])
def test_sglang_counts_that_are_no_counts_are_refused_naming_the_endpoint(meta, name):
    match = f"^u/generate: the server sent {re.escape(name)}, not a whole number >= 0$"
    with pytest.raises(LabError, match=match):
        acceptance([meta], "u/generate")


@pytest.mark.parametrize("usage", [None, "4", 4.5])
def test_a_vllm_usage_that_is_no_count_is_refused_naming_the_endpoint(usage):
    """A null usage.completion_tokens raised int()'s TypeError from the request's thread."""
    events = [(1.0, {"choices": [{"text": "Hi"}]}),
              (2.0, {"choices": [], "usage": {"completion_tokens": usage}})]
    with pytest.raises(LabError, match=f"^u: the server sent usage.completion_tokens {usage!r}, not a whole"):
        vllm_answer(events, [0.0], "u")


def test_a_vllm_choices_object_is_refused_naming_the_endpoint():
    """`choices` an object, not a list: choices[0] was a KeyError traceback."""
    with pytest.raises(LabError, match=r"^u: streamed event has no choices\[0\].text"):
        vllm_answer([(1.0, {"choices": {"text": "Hi"}})], [0.0], "u")


@pytest.mark.parametrize("value", ["abc", "NaN", "+Inf", "-3"])
def test_a_vllm_counter_that_is_no_count_is_refused_naming_metrics(value):
    """float() of a counter's text raised a ValueError; a NaN one priced NaN drafts (round() of it raised)."""
    page = f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {value}\n'
    match = "^" + re.escape(f"u/metrics: vllm:spec_decode_num_drafts_total is {value}, not a count")
    with pytest.raises(LabError, match=match):
        vllm_counters(page, "u/metrics")


def test_vllm_counters_at_zero_are_counts():
    """A server that has drafted nothing yet lists its counters at 0.0: counts, the per-position ones kept."""
    page = ('vllm:spec_decode_num_drafts_total{model_name="m"} 0.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 0.0\n')
    assert vllm_counters(page, "u/metrics") == {"drafts": 0.0, "accepted": 0.0, "per_pos": {0: 0.0}}


def test_a_served_decode_starts_no_more_request_slots_than_prompts(monkeypatch):
    """--concurrency 100000 over 2 prompts started 100000 threads before reading the first answer: their
    start was counted in the decode's wall seconds (its tok/s and requests in flight)."""
    from drafter_lab.spec import served

    started = []

    class Counted(threading.Thread):
        def start(self):
            started.append(self)
            super().start()

    class Server:
        def generate(self, ids, max_new_tokens):
            return served.Answer([1], 1, {}, 0.001, 0.001, 1)

        def start_counting(self):
            pass

    monkeypatch.setattr(served.threading, "Thread", Counted)
    cfg = served.ServedConfig(url="u", concurrency=1000)
    answers, _ = served._decode(Server(), [[1], [2]], cfg, speculative=True)
    assert len(answers) == 2 and len(started) == 2


def test_sglang_settings_that_are_no_counts_are_refused_before_any_prompt(random_llama, conversations,
                                                                          monkeypatch):
    """/get_server_info's speculative_num_draft_tokens "x" raised int()'s ValueError once every prompt had
    been decoded; it is refused, naming the endpoint, before the first request."""
    from drafter_lab.spec import served
    from drafter_lab.targets.hf import load_tokenizer

    sent = []
    monkeypatch.setattr(served.SGLang, "settings", lambda self: {"speculative_num_draft_tokens": "x"})
    monkeypatch.setattr(served.SGLang, "generate", lambda self, ids, n: sent.append(ids))
    cfg = served.ServedConfig(url="http://h:1/")
    match = "^http://h:1/get_server_info: the server sent speculative_num_draft_tokens 'x'"
    with pytest.raises(LabError, match=match):
        served.served_evaluate(load_tokenizer(random_llama), conversations, cfg)
    assert sent == []


def test_a_prompt_set_given_twice_is_refused_before_the_target_loads(prompts_file, tmp_path, cli_error):
    """It was decoded once per mention and pooled as that many sets; a fourth `p.jsonl` (its stem, then its
    path, taken) replaced the second's set."""
    again = tmp_path / "link.jsonl"
    again.symlink_to(prompts_file)
    err = cli_error(["eval", "--drafter", str(tmp_path / "none"), "--target", str(tmp_path / "none"),
                     "--prompts", str(prompts_file), "--prompts", str(again)])
    assert err == f"error: {again}: --prompts names this file twice: give each prompt set once"


def test_a_replay_that_ran_no_verify_step_is_refused_naming_its_metric(tmp_path, cli_error):
    """train writes replay_accept_len_k 0.0 where the replay ran no cycle at that depth: `--sampled` priced it
    as "accept_by_steps[1] must be a positive number", a list the run directory does not hold."""
    run = tmp_path / "run"
    run.mkdir()
    val = {"split": "val", "step": 7, "positions": 40, "sampled_acc_0": 0.5, "replay_accept_len_0": 1.4,
           "replay_accept_len_1": 0.0}
    (run / "metrics.jsonl").write_text(json.dumps(val) + "\n")
    err = cli_error(["costmodel", "--sampled", "--inputs", str(run)])
    metrics = run / "metrics.jsonl"
    assert err.startswith(f"error: {metrics}: its validation at step 7 has replay_accept_len_1 0, below 1")


def test_an_input_given_twice_is_refused(tmp_path, cli_error):
    """A sweep given twice listed each of its rows twice in the settings table; an eval twice was refused as
    two drafters' measurements."""
    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": [{"served_accept_len": 2.0, "config": {"steps": 2}}]}))
    again = tmp_path / "link.json"
    again.symlink_to(f)
    assert cli_error(["costmodel", "--inputs", str(f), "--inputs", str(again)]) == (
        f"error: {again}: --inputs names this file twice: give each input once")


@pytest.mark.parametrize("spec, batch", [(3.4, 3), (0.2, 1), (0, None), (-1.0, None)])
def test_a_served_eval_at_a_request_rate_is_priced_at_the_requests_it_carried(spec, batch):
    """Its mean requests in flight, not its --concurrency; none (0) carried is no served eval."""
    from drafter_lab.spec.costinputs import drafting
    from drafter_lab.spec.costmodel import CostModelConfig

    data = {"served_accept_len": 2.0, "in_flight": {"spec": spec, "baseline": None},
            "config": {"steps": 3, "topk": 1, "concurrency": 16, "request_rate": 2.0}}
    if batch is None:
        with pytest.raises(LabError, match="^e.json: a served eval at a request rate needs in_flight.spec"):
            drafting(CostModelConfig(), data, "e.json")
    else:
        assert drafting(CostModelConfig(), data, "e.json").batch == batch


def test_a_prediction_of_one_token_per_step_is_priced(tmp_path, capsys):
    """A drafter that is never right predicts 1.0 at every depth (the bonus token alone): a loss to show,
    not a replay that ran no verify step."""
    from drafter_lab.cli import main

    run = tmp_path / "run"
    run.mkdir()
    val = {"split": "val", "step": 3, "positions": 40, "cond_acc_0": 0.0, "sampled_acc_0": 0.0,
           "replay_accept_len_0": 1.0}
    (run / "metrics.jsonl").write_text(json.dumps(val) + "\n")
    for sampled in ([], ["--sampled"]):
        assert main(["costmodel", *sampled, "--inputs", str(run)]) == 0
    assert "1.00 at 1..1 steps" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["draft_step_us_by_batch", "draft_extend_us_by_batch"])
def test_a_batch_table_at_batch_zero_is_refused(tmp_path, cli_error, key):
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({key: {"0": 50.0, "8": 80.0}}))
    assert cli_error(["costmodel", "--inputs", str(f)]) == (
        f"error: {f}: {key} must map batch sizes (>= 1) to microseconds")


@pytest.mark.parametrize("table", [[3.0], {"1": 3.0}, {"x": {"1": 3.0}}],
                         ids=["list", "row-number", "batch-text"])
def test_a_pass_table_of_another_shape_is_refused(tmp_path, cli_error, table):
    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"verify_ms_by_tokens": table}))
    assert cli_error(["costmodel", "--inputs", str(f)]) == (
        f"error: {f}: verify_ms_by_tokens must map batch sizes to {{tokens per row: ms}}")


def test_a_pass_table_is_read_with_whole_batches_and_token_counts(tmp_path):
    from drafter_lab.spec.costinputs import apply_inputs
    from drafter_lab.spec.costmodel import CostModelConfig

    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"verify_ms_by_tokens": {"1": {"1": 2.0, "4": 3.0}, "8": {"1": 2.5}}}))
    cfg, _ = apply_inputs(CostModelConfig(), f)
    assert cfg.pass_ms_by_tokens == {1: {1: 2.0, 4: 3.0}, 8: {1: 2.5}}


@pytest.mark.parametrize("table", [{"0": {"1": 2.0}}, {"1": {"0": 2.0}}], ids=["batch-zero", "tokens-zero"])
def test_a_pass_table_at_zero_is_refused(tmp_path, cli_error, table):
    f = tmp_path / "verify.json"
    f.write_text(json.dumps({"verify_ms_by_tokens": table}))
    assert cli_error(["costmodel", "--inputs", str(f)]) == (
        f"error: {f}: verify_ms_by_tokens must map batch sizes (>= 1) to {{tokens per row (>= 1): ms}}")
