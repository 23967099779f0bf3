"""Mutation audit (review s76, h2) of the served eval (drafter_lab/spec/served.py): its documented
defaults, the counts a streamed SGLang answer carries, and the numbers derived from them."""

from __future__ import annotations

import dataclasses
import json
import math
import queue
import re
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from drafter_lab.errors import LabError
from drafter_lab.httpjson import HTTPStatusError
from drafter_lab.spec import served


def test_a_served_configs_defaults_are_the_documented_ones():
    """A library caller that sets only the URL gets greedy, one request in flight, 64 tokens, seed 0,
    a 600 s read timeout and 3 retries."""
    fields = {f.name: f.default for f in dataclasses.fields(served.ServedConfig) if f.name != "url"}
    assert fields == {"engine": "sglang", "baseline_url": None, "model": None, "max_new_tokens": 64,
                      "temperature": 0.0, "concurrency": 1, "request_rate": None, "seed": 0, "timeout_s": 600.0,
                      "retries": 3}


def test_an_answer_that_was_not_retried_counts_no_retries():
    answer = served.Answer([1, 2], 2, {}, 0.1, 0.3, 2)
    assert served._requests([answer])["retries"] == [0]


@pytest.mark.parametrize("count", [float("inf"), "4", 2.5, None, -1, True],
                         ids=["inf", "text", "fraction", "null", "negative", "bool"])
def test_a_streamed_sglang_count_that_is_no_count_is_one_line(count):
    """int() raised an OverflowError traceback on JSON's Infinity, took "4" and True, and cut 2.5 to 2."""
    events = [(1.0, {"output_ids": [5], "meta_info": {"completion_tokens": count}})]
    match = re.escape(f"u/generate: the server sent meta_info.completion_tokens {count!r}, not a whole number >= 0")
    with pytest.raises(LabError, match=f"^{match}$"):
        served.sglang_answer(events, [0.0], "u/generate")


@pytest.mark.parametrize("rate", [None, 2.0])
def test_there_is_one_arrival_per_request(rate):
    assert len(served.arrival_times(5, rate, seed=0)) == 5


class _Refusing:
    """A server that refuses every prompt as past its context length (a 400), recording what it was asked."""

    def __init__(self):
        self.calls: list = []

    def generate(self, ids, max_new_tokens):
        self.calls.append(("generate", ids))
        raise HTTPStatusError(400, "past the context length", "http://s/generate")

    def start_counting(self):
        self.calls.append(("start_counting",))


def test_a_prompt_refused_at_the_warm_up_is_named_and_nothing_more_is_sent():
    """The warm-up sends the first prompt: its refusal names that prompt and ends the eval there."""
    cfg, refusing = served.ServedConfig(url="http://s", max_new_tokens=4), _Refusing()
    with pytest.raises(LabError, match=r"^prompt 0 \(a\), 2 tokens \+ --max-new-tokens 4, was refused "):
        served._decode(refusing, [[1, 2], [3]], cfg, speculative=True, names=["a", "b"])
    assert refusing.calls == [("generate", [1, 2])]


def test_a_vllm_model_given_is_used_and_one_looked_up_is_asked_for_once(http_server):
    asked = []

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = json.dumps({"data": [{"id": "listed"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    url = http_server(Models)
    given = served.VLLM(url, served.ServedConfig(url=url, engine="vllm", model="given"))
    assert given.settings() == {"model": "given"} and asked == []
    listed = served.VLLM(url + "/", served.ServedConfig(url=url, engine="vllm"))
    assert listed.settings() == listed.settings() == {"model": "listed"} and asked == ["/v1/models"]


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, kind: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _fake_vllm(http_server, metrics: str | None, posts: list) -> str:
    """A vLLM server over real HTTP: /metrics answers `metrics` (None: a 404), and each completion streams
    "Hi" then "!" and the usage."""

    class VLLM(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/metrics" and metrics is not None:
                _send(self, 200, metrics.encode(), "text/plain")
            else:
                self.send_error(404)

        def do_POST(self):
            posts.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            events = [{"choices": [{"text": "Hi"}]}, {"choices": [{"text": "!"}]},
                      {"choices": [], "usage": {"completion_tokens": 2}}]
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            _send(self, 200, stream.encode(), "text/event-stream")

    return http_server(VLLM)


DRAFTS = 'vllm:spec_decode_num_drafts_total{model_name="m"} 6.0\n'


def test_a_vllm_completion_is_streamed_with_the_settings_asked_for(http_server):
    posts: list = []
    url = _fake_vllm(http_server, DRAFTS, posts)
    cfg = served.ServedConfig(url=url, engine="vllm", model="m", temperature=0.5)
    answer = served.VLLM(url + "/", cfg).generate([3, 4], 7)
    assert (answer.output, answer.tokens, answer.chunks, answer.retries) == ("Hi!", 2, 2, 0)
    (path, body), = posts
    assert path == "/v1/completions"
    assert {k: body[k] for k in ("model", "prompt", "max_tokens", "temperature", "stream", "stream_options")} == {
        "model": "m", "prompt": [3, 4], "max_tokens": 7, "temperature": 0.5, "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("metrics, speculates", [(DRAFTS, True), ("vllm:num_requests_running 0\n", False),
                                                 (None, None)], ids=["counters", "no-counters", "no-metrics"])
def test_whether_a_vllm_server_speculates_is_read_from_its_metrics(http_server, metrics, speculates):
    url = _fake_vllm(http_server, metrics, [])
    assert served.VLLM(url, served.ServedConfig(url=url, engine="vllm", model="m")).speculates() is speculates


def test_vllm_counting_starts_from_the_metrics_and_refuses_a_server_without_drafts(http_server):
    url = _fake_vllm(http_server, DRAFTS, [])
    server = served.VLLM(url, served.ServedConfig(url=url, engine="vllm", model="m"))
    server.start_counting()
    assert server.before == {"drafts": 6.0, "accepted": 0.0, "per_pos": {}}
    plain = _fake_vllm(http_server, "vllm:num_requests_running 0\n", [])
    with pytest.raises(LabError, match=f"^{re.escape(plain)}/metrics: the server counted no speculative drafts "):
        served.VLLM(plain, served.ServedConfig(url=plain, engine="vllm", model="m")).start_counting()


class _Answering:
    """A server that answers every prompt at once (each answer retried `retries` times), recording the calls."""

    def __init__(self, retries: int = 0):
        self.calls: list = []
        self.retries = retries

    def generate(self, ids, max_new_tokens):
        self.calls.append(("generate", ids))
        return served.Answer([1, 2], 2, {}, 0.01, 0.02, 2, self.retries)

    def start_counting(self):
        self.calls.append(("start_counting",))


@pytest.mark.parametrize("speculative", [True, False])
def test_only_the_speculative_server_counts_and_from_after_the_warm_up(speculative):
    """vLLM's counters are read after the warm-up, so its drafts are left out; a baseline has none to read."""
    server = _Answering()
    answers, _ = served._decode(server, [[1], [2]], served.ServedConfig(url="http://s"), speculative=speculative)
    counting = [("start_counting",)] if speculative else []
    assert server.calls == [("generate", [1]), *counting, ("generate", [1]), ("generate", [2])]
    assert [a.output for a in answers] == [[1, 2], [1, 2]]


@pytest.mark.parametrize("speculative, label", [(True, "speculative"), (False, "baseline")])
def test_retried_requests_are_logged_naming_the_side(speculative, label, capsys):
    served._decode(_Answering(retries=1), [[1], [2]], served.ServedConfig(url="http://s"), speculative=speculative)
    assert f"eval --server ({label}): 2 of 2 requests were retried before their stream began" in capsys.readouterr().err


def test_requests_that_were_not_retried_are_not_logged(capsys):
    served._decode(_Answering(), [[1], [2]], served.ServedConfig(url="http://s"), speculative=True)
    assert "retried" not in capsys.readouterr().err


def test_a_streamed_vllm_event_that_is_no_object_is_one_line():
    with pytest.raises(LabError, match=r"^u: streamed event is not an object: \[1, 2\]$"):
        served.vllm_answer([(1.0, [1, 2])], [0.0], "u")


def _fake_sglang(http_server, info: dict | None) -> str:
    """An SGLang server over real HTTP: /get_server_info answers `info` (None: a 404, an older server), and
    each /generate streams 3 tokens from one verify step that accepted 2 drafts."""

    class SGLang(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/get_server_info" and info is not None:
                _send(self, 200, json.dumps(info).encode())
            else:
                self.send_error(404)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            events = [{"output_ids": [5], "meta_info": {"completion_tokens": 1}},
                      {"output_ids": [5, 6, 7], "meta_info": {"completion_tokens": 3, "spec_verify_ct": 1,
                                                              "spec_accept_histogram": [0, 0, 1]}}]
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            _send(self, 200, stream.encode(), "text/event-stream")

    return http_server(SGLang)


@pytest.mark.parametrize("info, config, hist", [
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 4,
      "speculative_num_draft_tokens": 8},
     {"steps": 3, "topk": 4, "draft_tokens": 7, "drafting": "tree"}, {"1": 0, "2": 0, "3": 2, "4": 0}),
    (None, {"steps": None, "topk": None, "draft_tokens": None, "drafting": None}, {"1": 0, "2": 0, "3": 2}),
], ids=["tree", "no-server-info"])
def test_a_served_sglang_eval_reports_the_servers_settings(http_server, random_llama, conversations, info, config,
                                                            hist):
    """A tree's settings are reported as a tree (SGLang's draft tokens count the verified root), its
    histogram filled to every depth it could reach; an older server's unknown settings stay unknown."""
    from drafter_lab.targets.hf import load_tokenizer

    url = _fake_sglang(http_server, info)
    r = served.served_evaluate(load_tokenizer(random_llama), conversations[:2], served.ServedConfig(url=url))
    assert {k: r["config"][k] for k in config} == config
    assert (r["served_accept_len"], r["verify_steps"], r["accept_histogram"]) == (2.0, 2, hist)
    assert r["in_flight"]["baseline"] is None and "baseline_tok_s" not in r and "lossless_check" not in r


def test_a_served_vllm_eval_reads_its_chain_from_the_per_position_counters(http_server, random_llama, conversations):
    """Each completion counts one draft that accepted 2 of 3 positions: a chain of 3 draft tokens."""
    from drafter_lab.targets.hf import load_tokenizer

    done = []

    class VLLM(BaseHTTPRequestHandler):
        def do_GET(self):
            n = len(done)
            per_pos = [n, n, 0]
            lines = [f"vllm:spec_decode_num_drafts_total {n}", f"vllm:spec_decode_num_accepted_tokens_total {2 * n}",
                     *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}} {c}'
                       for j, c in enumerate(per_pos))]
            _send(self, 200, "\n".join(lines).encode(), "text/plain")

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            events = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "bc"}]},
                      {"choices": [], "usage": {"completion_tokens": 3}}]
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            done.append(1)
            _send(self, 200, stream.encode(), "text/event-stream")

    url = http_server(VLLM)
    cfg = served.ServedConfig(url=url, engine="vllm", model="m")
    r = served.served_evaluate(load_tokenizer(random_llama), conversations[:2], cfg)
    assert {k: r["config"][k] for k in ("steps", "topk", "draft_tokens", "drafting")} == {
        "steps": 3, "topk": 1, "draft_tokens": 3, "drafting": "chain"}
    assert (r["served_accept_len"], r["verify_steps"]) == (3.0, 2)  # the warm-up's draft left out
    assert r["accept_histogram"] == {"1": 0, "2": 0, "3": 2, "4": 0}


def test_a_served_eval_with_a_baseline_times_and_compares_both_sides(http_server, random_llama, conversations):
    from drafter_lab.targets.hf import load_tokenizer

    spec = _fake_sglang(http_server, {"speculative_algorithm": "EAGLE3"})
    base = _fake_sglang(http_server, {"speculative_algorithm": None})
    cfg = served.ServedConfig(url=spec, baseline_url=base)
    r = served.served_evaluate(load_tokenizer(random_llama), conversations[:2], cfg)
    assert (r["baseline_server"], r["baseline_tokens"], r["lossless_check"]) == (base, 6, "identical")
    assert len(r["requests"]["baseline"]["ttft_ms"]) == len(r["requests"]["spec"]["ttft_ms"]) == 2
    assert r["latency"]["baseline"]["ttft_ms"]["median"] is not None and r["in_flight"]["baseline"] > 0


class _WaitsRecorded(threading.Event):
    """The slots' stop event, recording each wait's timeout: a slot waits on it for its request's arrival."""
    waits: list[float] = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return super().wait(timeout)


def test_requests_sent_all_at_once_wait_for_no_arrival(monkeypatch):
    """Without a request rate every request has arrived at the start: its slot waits 0 s before sending it."""
    monkeypatch.setattr(_WaitsRecorded, "waits", [])
    monkeypatch.setattr(served, "threading", SimpleNamespace(Event=_WaitsRecorded, Thread=threading.Thread))
    served._decode(_Answering(), [[1], [2], [3]], served.ServedConfig(url="http://s"), speculative=False)
    assert _WaitsRecorded.waits == [0.0, 0.0, 0.0]


def test_a_slot_waiting_for_its_arrival_stops_at_another_slots_failure():
    """A request due in about a day: its slot slept until then before it saw that the first request had
    failed (a daemon thread left sleeping in a study that goes on to its next setting)."""
    threads = set(threading.enumerate())

    class Failing:
        calls = 0

        def generate(self, ids, max_new_tokens):
            self.calls += 1
            if self.calls == 2:  # the first request after the warm-up
                raise LabError("the server aborted the request", "http://s/generate")
            return served.Answer([1], 1, {}, 0.001, 0.001, 1)

    cfg = served.ServedConfig(url="http://s", concurrency=2, request_rate=1e-5, seed=0)
    assert served.arrival_times(2, cfg.request_rate, cfg.seed)[1] > 3600
    with pytest.raises(LabError, match="aborted"):
        served._decode(Failing(), [[1], [2]], cfg, speculative=False)
    slots = [t for t in set(threading.enumerate()) - threads if t.name == "drafter-lab-eval"]
    for t in slots:
        t.join(30)
    assert not any(t.is_alive() for t in slots)


CONVERSATIONS = [SimpleNamespace(id="a"), SimpleNamespace(id="b"), SimpleNamespace(id="c")]


def test_greedy_outputs_are_compared_naming_the_first_difference():
    assert served._compare([[1, 2], [3]], [[1, 2], [3]], CONVERSATIONS, 0.0) == "identical"
    assert served._compare([[1, 2], [3], [4, 5]], [[1, 2], [3, 9], [4, 6]], CONVERSATIONS, 0.0) == \
        "2 of 3 prompts differ (first: prompt 1 (b) at generated token 1)"
    assert served._compare(["ab", "cd"], ["ab", "ce"], CONVERSATIONS, 0.0) == \
        "1 of 2 prompts differ (first: prompt 1 (b) at generated character 1)"


@pytest.mark.parametrize("temperature, check", [(1e-6, "skipped: sampling (temperature > 0)"), (0.0, "1 of 1")])
def test_sampled_outputs_are_not_compared(temperature, check):
    assert served._compare([[1]], [[2]], CONVERSATIONS, temperature).startswith(check)


def _vllm(before: dict, after: dict) -> served.VLLM:
    server = served.VLLM("http://v", served.ServedConfig(url="http://v", engine="vllm", model="m"))
    server.before, server._counters = before, lambda: after
    return server


ANSWER = served.Answer([7, 8, 9], 3, {}, 0.1, 0.2, 2)


def test_a_per_position_counter_that_did_not_grow_has_not_gone_back():
    """No draft reached position 1 during the eval: its counter stands where it stood."""
    before = {"drafts": 10.0, "accepted": 13.0, "per_pos": {0: 8.0, 1: 5.0}}
    after = {"drafts": 20.0, "accepted": 21.0, "per_pos": {0: 16.0, 1: 5.0}}
    assert _vllm(before, after).acceptance([ANSWER]) == (pytest.approx(1.8), 10, {"1": 2, "2": 8, "3": 0})


@pytest.mark.parametrize("counted", [1.0, 0.0])
def test_a_per_position_counter_that_is_gone_has_gone_back(counted):
    """One at 0 before too: the positions after it would shift one place down the histogram."""
    before = {"drafts": 10.0, "accepted": 1.0, "per_pos": {0: 1.0, 1: counted, 2: 0.0}}
    after = {"drafts": 20.0, "accepted": 1.0, "per_pos": {0: 1.0, 2: 0.0}}
    with pytest.raises(LabError, match="^http://v/metrics: the speculative counters went back during the eval"):
        _vllm(before, after).acceptance([ANSWER])


@pytest.mark.parametrize("tokens", [1, 3])
def test_one_draft_counted_during_the_eval_is_an_accept_length(tokens):
    before = {"drafts": 10.0, "accepted": 4.0, "per_pos": {}}
    after = {"drafts": 11.0, "accepted": 5.0, "per_pos": {}}
    answer = served.Answer([7] * tokens, tokens, {}, 0.1, 0.2, tokens)
    assert _vllm(before, after).acceptance([answer]) == (2.0, 1, None)  # no per-position counters: no histogram


def test_no_drafts_over_answers_past_their_first_token_blame_the_drafter():
    counters = {"drafts": 10.0, "accepted": 4.0, "per_pos": {}}
    answer = served.Answer([7, 8], 2, {}, 0.1, 0.2, 2)
    with pytest.raises(LabError, match="^http://v/metrics: the server counted no speculative drafts during the eval"):
        _vllm(counters, counters).acceptance([answer])


@pytest.mark.parametrize("info, speculates", [({"speculative_algorithm": "EAGLE3"}, True),
                                              ({"speculative_algorithm": None}, False), (None, None),
                                              (["not", "an", "object"], None)],
                         ids=["eagle", "none", "no-server-info", "no-object"])
def test_whether_an_sglang_server_speculates_is_read_from_its_server_info(http_server, info, speculates):
    url = _fake_sglang(http_server, info)
    assert served.SGLang(url, served.ServedConfig(url=url)).speculates() is speculates


def test_sglang_acceptance_names_the_generate_endpoint():
    server = served.SGLang("http://s/", served.ServedConfig(url="http://s/"))
    with pytest.raises(LabError, match="^http://s/generate: the server reports no speculative decoding"):
        server.acceptance([served.Answer([7] * 5, 5, {"completion_tokens": 5}, 0.1, 0.2, 4)])


@pytest.mark.parametrize("rate, ok", [(0.5, True), (1e9, True), (0.0, False), (-1.0, False), (math.inf, False),
                                      (math.nan, False)])
def test_a_request_rate_must_be_a_positive_finite_number(rate, ok):
    cfg = served.ServedConfig(url="http://s", request_rate=rate)
    if ok:
        served.check_settings(cfg)
    else:
        with pytest.raises(LabError, match="^the request rate must be a positive number of requests per second"):
            served.check_settings(cfg)


def test_a_slot_whose_request_failed_takes_no_further_one_however_late_the_failure_is_read(monkeypatch):
    """The slot stops itself: the decode reading the failure (and stopping every slot) may come later
    than the slot's next turn, here only once the slot has ended."""
    slots, sent = [], []

    class Slot(threading.Thread):
        def start(self):
            slots.append(self)
            super().start()

    class Finished(queue.SimpleQueue):
        def get(self, *args, **kwargs):
            i, answer = super().get(*args, **kwargs)
            if isinstance(answer, Exception):
                for slot in slots:
                    slot.join(30)
            return i, answer

    class Failing(_Answering):
        def generate(self, ids, max_new_tokens):
            sent.append(ids)
            if ids == [1]:
                raise LabError("the server aborted the request", "http://s/generate")
            return super().generate(ids, max_new_tokens)

    monkeypatch.setattr(served, "threading", SimpleNamespace(Thread=Slot, Event=threading.Event))
    monkeypatch.setattr(served, "queue", SimpleNamespace(SimpleQueue=Finished, Empty=queue.Empty))
    with pytest.raises(LabError, match="aborted"):
        served._decode(Failing(), [[0], [1], [2], [3]], served.ServedConfig(url="http://s"), speculative=False)
    assert sent == [[0], [0], [1]]  # the warm-up, then prompts 0 and 1


def test_sglang_answers_past_their_first_token_without_verify_counts_are_no_speculation():
    with pytest.raises(LabError, match="^u: the server reports no speculative decoding"):
        served.acceptance([{"completion_tokens": 2}], "u")


def test_sglang_verify_counts_at_zero_are_no_verify_step():
    with pytest.raises(LabError, match="^u: the server ran no verify step: raise --max-new-tokens$"):
        served.acceptance([{"completion_tokens": 1, "spec_verify_ct": 0}], "u")


def test_a_served_eval_checks_its_settings_before_anything_else():
    with pytest.raises(LabError, match="^concurrency must be >= 1, got 0$"):
        served.served_evaluate(None, [], served.ServedConfig(url="http://s", concurrency=0))


def test_one_verify_step_is_an_accept_length():
    assert served.acceptance([{"completion_tokens": 3, "spec_verify_ct": 1}], "u") == (2.0, 1, None)


@pytest.mark.parametrize("tokens", ["3", 2.5, None, -1])
def test_acceptance_refuses_a_completion_count_that_is_not_whole(tokens):
    """Called on meta_infos directly (not through sglang_answer's check), "3" counted as 3, 2.5 as 2 and a
    null raised a TypeError traceback."""
    with pytest.raises(LabError, match=r"^u: the server sent meta_info.completion_tokens .*, not a whole number >= 0$"):
        served.acceptance([{"completion_tokens": tokens, "spec_verify_ct": 1}], "u")
    with pytest.raises(LabError, match="^u: the server sent meta_info.completion_tokens"):
        served.acceptance([{"completion_tokens": tokens}, {"completion_tokens": "x"}], "u")


def test_a_baseline_server_that_speculates_is_refused(http_server, random_llama, conversations):
    from drafter_lab.targets.hf import load_tokenizer

    spec, base = (_fake_sglang(http_server, {"speculative_algorithm": "EAGLE3"}) for _ in range(2))
    with pytest.raises(LabError, match=f"^{re.escape(base)}: --baseline-server speculates"):
        served.served_evaluate(load_tokenizer(random_llama), conversations[:1],
                               served.ServedConfig(url=spec, baseline_url=base))


@pytest.mark.parametrize("change, message", [({"engine": "tgi"}, "unknown engine 'tgi': use sglang or vllm"),
                                             ({"retries": -1}, "retries must be >= 0, got -1")])
def test_an_engine_or_retries_a_served_eval_cannot_use_is_one_line(change, message):
    with pytest.raises(LabError, match=f"^{re.escape(message)}$"):
        served.check_settings(served.ServedConfig(url="http://s", **change))


def test_a_refused_prompt_without_conversation_ids_is_named_by_its_index():
    cfg = served.ServedConfig(url="http://s", max_new_tokens=4)
    with pytest.raises(LabError, match=r"^prompt 0, 2 tokens \+ --max-new-tokens 4, was refused "):
        served._decode(_Refusing(), [[1, 2]], cfg, speculative=False)


def test_a_requests_tpot_is_its_decode_seconds_per_token_after_the_first():
    answer = served.Answer([1, 2, 3], 3, {}, 0.1, 0.3, 3)
    assert served._requests([answer])["tpot_ms"] == [pytest.approx(100.0)]
