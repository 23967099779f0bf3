"""`drafter-lab eval --server`: a real server process that answers SGLang's or vLLM's API gives the same
served accept length and histogram as the lab's own eval, feeds the cost model, and bad use is one line."""

from __future__ import annotations

import io
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest

from drafter_lab.cli import main
from drafter_lab.data.chat import template_sha256
from drafter_lab.errors import LabError
from drafter_lab.spec.served import acceptance, arrival_times, sglang_answer, vllm_answer, vllm_counters
from drafter_lab.targets.hf import load_tokenizer

SERVER = Path(__file__).with_name("spec_server.py")
STEPS = 4


def _start(engine: str, model, drafter, port_file: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SERVER), engine, str(model), str(drafter), str(STEPS),
                             str(port_file)])


@pytest.fixture(scope="module")
def opinionated_llama(random_llama, tmp_path_factory) -> Path:
    """The random Llama with Qwen2.5's generation_config.json knobs, which a server applies to every
    request that leaves them unset (the test servers refuse to sample so)."""
    out = tmp_path_factory.mktemp("opinionated") / "model"
    shutil.copytree(random_llama, out)
    (out / "generation_config.json").write_text(json.dumps({"top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}))
    return out


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def servers(request, opinionated_llama, drafter_dir, tmp_path_factory):
    """(engine, speculative server URL, baseline server URL), both over the random Llama."""
    tmp = tmp_path_factory.mktemp("servers")
    engine = request.param
    procs = [_start(engine, opinionated_llama, drafter_dir, tmp / "spec"),
             _start(engine, opinionated_llama, "-", tmp / "base")]
    deadline = time.time() + 120
    try:
        for proc, name in zip(procs, ("spec", "base")):
            while not (tmp / name).exists():
                assert proc.poll() is None and time.time() < deadline, "a test server did not start"
                time.sleep(0.05)
        yield engine, *(f"http://127.0.0.1:{(tmp / name).read_text()}" for name in ("spec", "base"))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_served_eval_equals_the_labs_own(random_llama, drafter_dir, prompts_file, servers, tmp_path, capsys):
    engine, spec, base = servers
    common = ["--target", str(random_llama), "--prompts", str(prompts_file), "--max-new-tokens", "16",
              "--chat-template-kwargs", '{"enable_thinking": false}']  # the template ignores it; both record it
    assert main(["eval", "--drafter", str(drafter_dir), "--steps", str(STEPS), *common,
                 "--json", str(tmp_path / "local.json")]) == 0
    assert main(["eval", "--server", spec, "--engine", engine, "--baseline-server", base, "--concurrency", "2",
                 *common, "--json", str(tmp_path / "served.json")]) == 0
    text = capsys.readouterr().out
    settings = f"(algorithm EAGLE3, num_steps {STEPS}" if engine == "sglang" else "(model tiny)"
    assert f"{engine} server {spec} {settings}" in text and "baseline server" in text
    local, served = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("local", "served"))
    assert served["served_accept_len"] == pytest.approx(local["served_accept_len"], rel=1e-12)
    assert served["accept_histogram"] == local["accept_histogram"]
    assert served["verify_steps"] == local["verify_steps"]
    assert served["spec_tokens"] == local["spec_tokens"] == served["baseline_tokens"]
    assert served["lossless_check"] == "identical" and served["speedup"] > 0
    assert served["config"]["drafting"] == "chain" and served["config"]["steps"] == STEPS
    assert served["config"]["draft_tokens"] == local["config"]["draft_tokens"] == STEPS  # the root not counted
    assert served["config"]["chat_template_kwargs"] == local["config"]["chat_template_kwargs"] == {"enable_thinking": False}
    template = template_sha256(load_tokenizer(random_llama))
    assert served["config"]["chat_template_sha256"] == local["config"]["chat_template_sha256"] == template
    # Streamed: each request timed, its first token in an event of its own, then one event per verify
    # step (per token on the baseline server).
    requests = served["requests"]
    assert all(len(requests[side]["ttft_ms"]) == served["prompts"] for side in ("spec", "baseline"))
    assert sum(requests["spec"]["chunks"]) == served["prompts"] + served["verify_steps"]
    assert sum(requests["baseline"]["chunks"]) == served["baseline_tokens"]
    assert served["latency"]["tpot_speedup"] > 0 and "baseline server): TTFT median" in text
    tokens_per_event = served["spec_tokens"] / sum(requests["spec"]["chunks"])
    assert f"streamed tokens per event: speculative {tokens_per_event:.2f}, baseline server 1.00" in text
    # Its histogram gives the cost model's draft-steps table, as a local chain eval's does.
    assert main(["costmodel", "--inputs", str(tmp_path / "served.json"), "--json", str(tmp_path / "cm.json")]) == 0
    rows = json.loads((tmp_path / "cm.json").read_text())["steps_table"]
    assert [r["steps"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["accept"] == pytest.approx(local["served_accept_len"])


def test_served_eval_bad_use_is_one_line(random_llama, drafter_dir, prompts_file, servers, capsys):
    engine, spec, base = servers
    common = ["--target", str(random_llama), "--prompts", str(prompts_file), "--max-new-tokens", "4",
              "--engine", engine]

    def error(argv) -> str:
        assert main(argv) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    no_spec = "reports no speculative decoding" if engine == "sglang" else "counted no speculative drafts"
    assert no_spec in error(["eval", "--server", base, *common])
    assert "--steps, --batch and --schedule apply to the lab's own decoding" in error(
        ["eval", "--server", spec, "--steps", "3", "--batch", "2", "--schedule", "continuous", *common])
    assert "--plot applies to the lab's own decoding" in error(["eval", "--server", spec, "--plot", "p.png", *common])
    assert "apply to a served eval" in error(["eval", "--drafter", str(drafter_dir), "--baseline-server", base,
                                              *common[:-2]])
    # nan passed `temperature < 0` and went to the server
    assert "--temperature must be a finite number >= 0" in error(["eval", "--server", spec, "--temperature", "nan",
                                                                  *common])


def test_accept_length_leaves_out_the_prefill_token():
    metas = [{"completion_tokens": 9, "spec_verify_ct": 4}, {"completion_tokens": 5, "spec_verify_ct": 2}]
    assert acceptance(metas, "url") == (2.0, 6, None)  # (8 + 4) tokens from 6 verify steps
    hist = [{"completion_tokens": 4, "spec_verify_ct": 2, "spec_accept_histogram": [1, 0, 1]},
            {"completion_tokens": 3, "spec_verify_ct": 1, "spec_accept_histogram": [0, 1]}]
    # the histogram as sent; the length from the tokens the requests got (request 0's last step accepted
    # drafts past its end, which SGLang's histogram counts)
    assert acceptance(hist, "url") == (5 / 3, 3, {"1": 1, "2": 1, "3": 1})
    # recent SGLang leaves the speculative fields out for a request that ended at its first token
    assert acceptance([*metas, {"completion_tokens": 1}], "url") == (2.0, 6, None)
    assert acceptance([*hist, {"completion_tokens": 1}], "url") == (5 / 3, 3, {"1": 1, "2": 1, "3": 1})
    with pytest.raises(LabError, match="no speculative decoding"):
        acceptance([{"completion_tokens": 9}], "url")


def test_a_streamed_sglang_answer_is_timed_from_its_events():
    """Output ids come so far (SGLang's default) or new only (--incremental-streaming-output): the
    same answer, timed from its first event with tokens to its last."""
    ids = [[7], [7, 8, 9], [7, 8, 9], [7, 8, 9, 4]]
    metas = [{"completion_tokens": len(i)} for i in ids]
    metas[-1]["spec_verify_ct"] = 2
    times = [10.5, 10.75, 11.0, 11.5]
    cumulative = [(t, {"output_ids": i, "meta_info": m}) for t, i, m in zip(times, ids, metas)]
    incremental = [(t, {"output_ids": i[len(before):], "meta_info": m})
                   for t, i, before, m in zip(times, ids, [[], *ids], metas)]
    for events in (cumulative, incremental):
        a = sglang_answer(events, [10.0], "u")
        assert (a.output, a.tokens, a.first_s, a.last_s, a.chunks) == ([7, 8, 9, 4], 4, 0.5, 1.5, 3)
        assert a.meta["spec_verify_ct"] == 2  # the speculative counts come with the last event
    # An older server sends ids only with --return-token-ids: the text so far is the output.
    texts = [(t, {"text": x, "meta_info": m}) for t, x, m in zip(times, ["H", "Hel", "Hel", "Hell"], metas)]
    a = sglang_answer(texts, [10.0], "u")
    assert (a.output, a.tokens, a.first_s, a.last_s, a.chunks) == ("Hell", 4, 0.5, 1.5, 3)
    with pytest.raises(LabError, match="^u: streamed event has no meta_info.completion_tokens"):
        sglang_answer([(1.0, {"text": "hi"})], [0.0], "u")
    with pytest.raises(LabError, match="^u: the streamed answer carried no tokens$"):
        sglang_answer([], [0.0], "u")
    abort = {"type": "abort", "message": "Abort in waiting queue", "status_code": 503}  # streamed, then [DONE]
    with pytest.raises(LabError, match="^u: the server aborted the request: Abort in waiting queue$"):
        sglang_answer([*cumulative[:2], (12.0, {"output_ids": [7, 8, 9], "meta_info": {
            "completion_tokens": 3, "finish_reason": abort}})], [10.0], "u")


def test_a_streamed_vllm_answer_counts_its_usage():
    events = [(2.25, {"choices": [{"text": "He"}], "usage": None}), (2.5, {"choices": [{"text": "llo"}]}),
              (3.0, {"choices": [{"text": ""}]}),  # the eos: a token with no text
              (3.5, {"choices": [], "usage": {"completion_tokens": 4}})]
    a = vllm_answer(events, [2.0], "u")
    assert (a.output, a.tokens, a.first_s, a.last_s, a.chunks) == ("Hello", 4, 0.25, 1.0, 3)
    with pytest.raises(LabError, match=r"^u: the stream ended without usage.completion_tokens"):
        vllm_answer(events[:-1], [2.0], "u")
    aborted = [*events[:2], (3.0, {"choices": [{"text": "", "finish_reason": "abort"}]}), events[-1]]
    with pytest.raises(LabError, match=r"^u: the server aborted the request \(finish_reason 'abort'\)$"):
        vllm_answer(aborted, [2.0], "u")


def test_arrivals_are_a_seeded_poisson_process():
    at = arrival_times(20000, 4.0, seed=1)
    assert at[0] == 0.0 and all(b > a for a, b in zip(at, at[1:]))
    assert at == arrival_times(20000, 4.0, seed=1) != arrival_times(20000, 4.0, seed=2)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.03)  # exponential: mean 1 / rate ...
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)  # ... and as wide
    assert arrival_times(3, None, seed=1) == [0.0, 0.0, 0.0]


def test_requests_are_sent_as_they_arrive():
    """No request leaves before its arrival time (the warm-up precedes the start of the clock)."""
    from drafter_lab.spec import served

    class Recording:
        def __init__(self):
            self.sent: list[tuple[float, list[int]]] = []

        def generate(self, ids, max_new_tokens):
            self.sent.append((time.perf_counter(), ids))
            return served.Answer([1], 1, {}, 0.001, 0.001, 1)

        def start_counting(self):
            pass

    server, prompts = Recording(), [[i] for i in range(12)]
    cfg = served.ServedConfig(url="u", concurrency=3, request_rate=40.0, seed=3)
    answers, _ = served._decode(server, prompts, cfg, speculative=True)
    (warm_up, _), *sent = server.sent
    arrivals = dict(zip(map(tuple, prompts), arrival_times(12, 40.0, seed=3)))
    assert len(answers) == 12 and sorted(ids for _, ids in sent) == prompts
    assert all(at - warm_up >= arrivals[tuple(ids)] for at, ids in sent)


def test_a_retried_request_is_timed_from_the_try_that_was_answered(monkeypatch):
    """A refused connection, httpjson's 1 s back-off, then the stream: the TTFT is the answered try's
    (a fake clock that only the back-off and the first token move), and the retry is counted."""
    from drafter_lab import httpjson
    from drafter_lab.spec import served

    clock = [100.0]
    event = {"output_ids": [5], "meta_info": {"completion_tokens": 1, "spec_verify_ct": 0}}

    def urlopen(request, timeout):
        if clock[0] == 100.0:
            raise urllib.error.URLError(ConnectionRefusedError())
        clock[0] += 0.25  # the first token
        return io.BytesIO(f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())

    monkeypatch.setattr(httpjson, "time", SimpleNamespace(perf_counter=lambda: clock[0],
                                                          sleep=lambda s: clock.__setitem__(0, clock[0] + s)))
    monkeypatch.setattr(httpjson.urllib.request, "urlopen", urlopen)
    answer = served.SGLang("http://s", served.ServedConfig(url="http://s")).generate([1], 1)
    assert clock[0] == 101.25 and (answer.first_s, answer.retries) == (0.25, 1)
    assert served._requests([answer]) == {"ttft_ms": [250.0], "tpot_ms": [], "chunks": [1], "retries": [1]}


def test_the_first_failure_is_raised_while_other_requests_are_in_flight():
    """A failed request stops the sending and is raised at once, not once the requests in flight end
    (a served eval journals whole settings, so they are abandoned)."""
    from drafter_lab.spec import served

    release, in_flight, sent, order = threading.Event(), threading.Event(), [], []

    class Failing:
        def generate(self, ids, max_new_tokens):
            sent.append(ids)
            if ids == [1]:  # a long generation, in flight until the test releases it
                in_flight.set()
                release.wait(30)
                order.append("long request ended")
            if ids == [2]:  # fails once [1] is in flight (its slot may still be sleeping to its arrival)
                in_flight.wait(30)
                raise LabError("the server aborted the request", "http://s/generate")
            return served.Answer([1], 1, {}, 0.001, 0.001, 1)

        def start_counting(self):
            pass

    cfg = served.ServedConfig(url="http://s", concurrency=2)
    with pytest.raises(LabError, match="^http://s/generate: the server aborted the request$"):
        served._decode(Failing(), [[0], [1], [2], [3], [4]], cfg, speculative=True)
    order.append("raised")
    release.set()
    assert order[0] == "raised"
    assert sorted(sent[1:]) == [[0], [1], [2]]  # after the warm-up; [3] and [4] were never sent


def test_vllm_counters_sum_label_sets_and_ignore_the_rest():
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9',
        "vllm:spec_decode_num_accepted_tokens_total 12.0",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 7.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 1.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 4.0',
        'vllm:num_requests_running{engine="0"} 3.0',
    ])
    assert vllm_counters(text) == {"drafts": 15.0, "accepted": 12.0, "per_pos": {0: 8.0, 1: 4.0}}


def test_served_eval_of_two_prompt_sets_pools_them(random_llama, prompts_file, servers, tmp_path, capsys):
    engine, spec, _ = servers
    lines = prompts_file.read_text().splitlines(keepends=True)
    halves = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    halves[0].write_text("".join(lines[:3]))
    halves[1].write_text("".join(lines[3:]))
    argv = ["eval", "--server", spec, "--engine", engine, "--target", str(random_llama), "--max-new-tokens", "16"]
    assert main([*argv, "--prompts", str(halves[0]), "--prompts", str(halves[1]),
                 "--json", str(tmp_path / "sets.json")]) == 0
    assert main([*argv, "--prompts", str(prompts_file), "--json", str(tmp_path / "all.json")]) == 0
    assert "set a: 3 prompts" in capsys.readouterr().out
    pooled, whole = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sets", "all"))
    assert sorted(pooled["sets"]) == ["a", "b"] and pooled["prompts"] == 6
    # One request per prompt: the halves' verify steps and histograms add up to the whole file's.
    assert pooled["verify_steps"] == whole["verify_steps"] and pooled["spec_tokens"] == whole["spec_tokens"]
    assert pooled["accept_histogram"] == whole["accept_histogram"]
    assert pooled["served_accept_len"] == pytest.approx(whole["served_accept_len"], rel=1e-12)


def test_served_sweep_over_requests_in_flight(random_llama, prompts_file, servers, tmp_path, capsys):
    """`--concurrency 1,3`: a row per setting, as bench_speculative sweeps batch sizes; the cost model
    prices each row at its requests in flight."""
    engine, spec, base = servers
    out = tmp_path / "sweep.json"
    assert main(["eval", "--server", spec, "--engine", engine, "--baseline-server", base, "--concurrency", "1,3",
                 "--target", str(random_llama), "--prompts", str(prompts_file), "--max-new-tokens", "12",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert len([line for line in text.splitlines() if " | " in line]) == 3  # the header and a row each
    assert "fastest here" not in text  # the server's one drafting setting: nothing to choose between
    assert "this machine's speed" not in text  # but the server's
    sweep = json.loads(out.read_text())["sweep"]
    assert [r["config"]["concurrency"] for r in sweep] == [1, 3] and not (tmp_path / "sweep.json.partial").exists()
    assert sweep[0]["accept_histogram"] == sweep[1]["accept_histogram"]  # greedy: the same tokens either way
    assert all(r["lossless_check"] == "identical" for r in sweep)
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--json", str(model)]) == 0
    assert [row["batch"] for row in json.loads(model.read_text())["settings"]] == [1, 3]


def test_served_eval_at_a_request_rate(random_llama, drafter_dir, prompts_file, servers, tmp_path, capsys):
    """`--request-rate 20,40`: requests arrive as a Poisson process, the same on both servers; each row
    records its rate and the mean requests in flight, which the cost model prices it at."""
    engine, spec, base = servers
    out = tmp_path / "rates.json"
    assert main(["eval", "--server", spec, "--engine", engine, "--baseline-server", base, "--concurrency", "3",
                 "--request-rate", "20,40", "--seed", "5", "--target", str(random_llama), "--prompts",
                 str(prompts_file), "--max-new-tokens", "8", "--json", str(out)]) == 0
    assert "req/s" in capsys.readouterr().out
    rows = json.loads(out.read_text())["sweep"]
    assert [(r["config"]["request_rate"], r["config"]["seed"]) for r in rows] == [(20.0, 5), (40.0, 5)]
    for r in rows:
        assert all(0 < r["in_flight"][side] <= 3 for side in ("spec", "baseline"))
        assert r["lossless_check"] == "identical"
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--json", str(model)]) == 0
    priced = json.loads(model.read_text())["settings"]
    assert [row["batch"] for row in priced] == [max(1, round(r["in_flight"]["spec"])) for r in rows]
    # The lab's own decoding has no arrivals.
    assert main(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts",
                 str(prompts_file), "--request-rate", "2"]) == 2
    assert "--request-rate apply to a served eval" in capsys.readouterr().err


def test_killed_served_sweep_resumes(random_llama, prompts_file, servers, tmp_path, monkeypatch):
    from drafter_lab.spec import served

    engine, spec, _ = servers
    real, calls = served.served_evaluate, []

    def dies_on_the_second(tokenizer, convs, cfg, **kwargs):
        calls.append(cfg.concurrency)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(tokenizer, convs, cfg, **kwargs)

    out = tmp_path / "sweep.json"
    argv = ["eval", "--server", spec, "--engine", engine, "--concurrency", "1,2", "--target", str(random_llama),
            "--prompts", str(prompts_file), "--max-new-tokens", "8", "--json", str(out)]
    monkeypatch.setattr(served, "served_evaluate", dies_on_the_second)
    assert main(argv) == 130 and not out.exists()
    calls.clear()
    assert main(argv) == 0 and calls == [2]  # concurrency 1 came from the journal
    assert [r["config"]["concurrency"] for r in json.loads(out.read_text())["sweep"]] == [1, 2]
