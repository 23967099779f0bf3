"""`drafter-lab eval --server`: served accept length and tok/s from a running SGLang or vLLM server.

The lab's own `eval` decodes with its engine; this one asks the engine people serve with. Prompts
are rendered here with the target's chat template and sent as token ids, with plain sampling asked
for (servers.py), so the server decodes exactly the tokens the lab's eval would. The served accept
length is the lab's (tokens emitted per verify step, bonus included):

- SGLang: native `/generate` reports per request, in `meta_info`, `completion_tokens`,
  `spec_verify_ct` and, in recent versions, `spec_accept_histogram` (verify steps that accepted
  0, 1, 2, ... drafts). The accept length is (completion_tokens - 1) / spec_verify_ct summed over
  requests (each request's first token comes from prefill, not from a verify step); the histogram,
  where sent, is the server's: it counts the drafts a request's last step accepted past
  max_new_tokens or an eos too, which the request never got. `/get_server_info` records the
  speculative settings.
- vLLM: `/v1/completions` decodes; `/metrics` counts drafts, accepted tokens and accepted tokens
  per draft position. The difference of the counters before and after the prompts gives
  1 + accepted / drafts (vLLM's mean acceptance length, which counts drafts a request's last step
  accepted past max_tokens or an eos too), and, since a chain accepts a prefix, the histogram: drafts that accepted
  exactly j = accepted at position j-1 minus accepted at position j. The counters are the whole
  server's, so nothing else may use it while the eval runs.

Requests are streamed (`"stream": true`, as SGLang's and vLLM's bench_serving send them), so each
one's TTFT (from sending it to its first token; requests beyond --concurrency wait in the client,
as with bench_serving's --max-concurrency; a request retried after a refused connection or a 5xx
counts from the try that was answered, its retries counted apart) and TPOT (from its first token
to its last, per token after the first) are measured as a user sees them, with the events that
carried tokens counted.
They are sent all at once (only --concurrency holding them back), or arrive at --request-rate as
a seeded Poisson process (bench_serving's --request-rate), the same arrivals on both servers; the
mean requests in flight (Little's law: the requests' seconds over the wall seconds) is the load
the server actually carried. The first request that fails is raised at once, the others in flight
abandoned: a served eval journals whole settings, not requests.

With a baseline server (the same target served without speculation) the same prompts run there
too, so both tok/s come from the same run, and greedy outputs are compared; a serving engine's
batching need not be bitwise deterministic, so a difference is reported, not raised.
"""

from __future__ import annotations

import math
import queue
import random
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass

from drafter_lab.data.chat import rendered_with
from drafter_lab.errors import LabError
from drafter_lab.httpjson import (
    HTTPStatusError,
    check_timeout,
    request_json,
    request_text,
    stream_json,
    url_problem,
)
from drafter_lab.progress import log, progress
from drafter_lab.servers import PLAIN, served_model
from drafter_lab.spec.costmodel import finite
from drafter_lab.spec.eval import WARMUP_TOKENS, add_request, first_difference, latency, render_prompts

ENGINES = ("sglang", "vllm")


@dataclass
class ServedConfig:
    """Which servers to ask, and how."""

    url: str
    """Base URL of a server with speculative decoding (SGLang `--speculative-algorithm EAGLE3`, vLLM
    `--speculative-config`)."""
    engine: str = "sglang"
    """The serving engine behind the URLs: sglang or vllm."""
    baseline_url: str | None = None
    """Base URL of the same target served without speculation: tok/s and greedy outputs are compared."""
    model: str | None = None
    """vLLM: the served model name (default: the first one /v1/models lists)."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    temperature: float = 0.0
    """Sampling temperature sent with each request (0 = greedy)."""
    concurrency: int = 1
    """Requests in flight at most (1 = the latency-bound regime a drafter is for)."""
    request_rate: float | None = None
    """Requests per second, arriving as a Poisson process (exponential gaps drawn from `seed`, the
    first at once); None: all at once."""
    seed: int = 0
    """Seed of the arrival times."""
    timeout_s: float = 600.0
    """Seconds to wait for each read from the server (--timeout), not for a whole answer."""
    retries: int = 3
    """Retries of a request that failed to connect or got a 5xx or 429 answer (--retries)."""


@dataclass
class Answer:
    output: list | str
    """Generated token ids (SGLang) or text (vLLM)."""
    tokens: int
    """Tokens generated."""
    meta: dict
    """SGLang's meta_info ({} for vLLM)."""
    first_s: float
    """Seconds from sending the request (the try that was answered) to its first token (its TTFT)."""
    last_s: float
    """Seconds from sending the request (the try that was answered) to its last token."""
    chunks: int
    """Streamed events that carried tokens (one per verify step where the server streams every step)."""
    retries: int = 0
    """Tries before the one that was answered (a refused connection, a 5xx)."""


def _answer(output: list | str, tokens: int, meta: dict, sent: list[float], stamps: list[float],
            endpoint: str) -> Answer:
    if not stamps:
        raise LabError("the streamed answer carried no tokens", endpoint)
    start = sent[-1]  # the try that was answered: retries and their back-off are no part of the TTFT
    return Answer(output, tokens, meta, stamps[0] - start, stamps[-1] - start, len(stamps), len(sent) - 1)


def sglang_answer(events, sent: list[float], endpoint: str) -> Answer:
    """One streamed `/generate` answer from (arrival time, event)s, `sent` the times its tries were
    sent (stream_json's, filled once the events begin). Every event carries the cumulative
    meta_info.completion_tokens and the output ids so far, or only the new ones where the server runs
    with --incremental-streaming-output; the speculative counts come with the last. Servers older
    than that send ids only with --return-token-ids: their text so far is the output."""
    ids: list[int] | None = None
    text, count, meta = "", 0, {}
    stamps: list[float] = []
    for at, event in events:
        try:
            meta, now = event["meta_info"], event["meta_info"]["completion_tokens"]
        except (KeyError, TypeError):
            raise LabError(f"streamed event has no meta_info.completion_tokens: {str(event)[:200]}", endpoint) from None
        # int() cut 2.5 to 2, took "4", and raised an OverflowError traceback on JSON's Infinity
        now = _count(now, "meta_info.completion_tokens", endpoint)
        reason = meta.get("finish_reason")
        if isinstance(reason, dict) and reason.get("type") == "abort":  # SGLang streams an abort as an answer
            raise LabError(f"the server aborted the request: {reason.get('message') or reason}", endpoint)
        if event.get("text") is not None:  # recent servers send it with the last event only
            text = str(event["text"])
        if now > count:
            if isinstance(event.get("output_ids"), list):
                new = event["output_ids"]
                ids = list(new) if len(new) == now else (ids or []) + list(new)
            count = now
            stamps.append(at)
    return _answer(text if ids is None else ids, count, meta, sent, stamps, endpoint)


def vllm_answer(events, sent: list[float], endpoint: str) -> Answer:
    """One streamed `/v1/completions` answer from (arrival time, event)s, `sent` as sglang_answer's:
    each event with a choice carries new tokens (their text, which may be empty), the last the usage."""
    text: list[str] = []
    tokens, stamps = None, []
    for at, event in events:
        if not isinstance(event, dict):
            raise LabError(f"streamed event is not an object: {str(event)[:200]}", endpoint)
        if event.get("choices"):
            try:
                text.append(str(event["choices"][0].get("text") or ""))
                aborted = event["choices"][0].get("finish_reason") == "abort"
            except (AttributeError, TypeError, KeyError):  # KeyError: choices an object, not a list
                raise LabError(f"streamed event has no choices[0].text: {str(event)[:200]}", endpoint) from None
            if aborted:  # vLLM streams an abort as a finish reason, not an error event
                raise LabError("the server aborted the request (finish_reason 'abort')", endpoint)
            stamps.append(at)
        if isinstance(event.get("usage"), dict) and "completion_tokens" in event["usage"]:
            tokens = _count(event["usage"]["completion_tokens"], "usage.completion_tokens", endpoint)
    if tokens is None:
        raise LabError("the stream ended without usage.completion_tokens (asked for with "
                       "stream_options.include_usage)", endpoint)
    return _answer("".join(text), tokens, {}, sent, stamps, endpoint)


def _count(value, name: str, endpoint: str) -> int:
    """A count the server sent, as an int: a LabError naming it unless it is a whole number >= 0 (a null
    or text one raised a TypeError or ValueError traceback)."""
    if not (finite(value) and value >= 0 and value == int(value)):
        raise LabError(f"the server sent {name} {repr(value)[:200]}, not a whole number >= 0", endpoint)
    return int(value)


class SGLang:
    """SGLang's native API; acceptance is counted per request."""

    def __init__(self, url: str, cfg: ServedConfig):
        self.url, self.cfg = url.rstrip("/"), cfg

    def settings(self) -> dict:
        """The server's speculative_* settings, {} from an older server without /get_server_info (the
        numbers stand without it). Retried as a request is: a server still starting refuses the
        connection, and the result would silently lack its steps, topk and draft tokens."""
        try:
            info = request_json(self.url + "/get_server_info", timeout_s=self.cfg.timeout_s, retries=self.cfg.retries)
        except HTTPStatusError as e:
            if e.status != 404:
                raise
            return {}
        return {k: v for k, v in info.items() if k.startswith("speculative_")} if isinstance(info, dict) else {}

    def generate(self, ids: list[int], max_new_tokens: int) -> Answer:
        endpoint, sent = self.url + "/generate", []
        return sglang_answer(stream_json(endpoint, {"input_ids": ids, "stream": True, "sampling_params": {
            **PLAIN, "temperature": self.cfg.temperature, "max_new_tokens": max_new_tokens}},
            timeout_s=self.cfg.timeout_s, retries=self.cfg.retries, sent=sent), sent, endpoint)

    def speculates(self) -> bool | None:
        """Whether /get_server_info names a speculative algorithm (None: an older server without it)."""
        settings = self.settings()
        return bool(settings.get("speculative_algorithm")) if settings else None

    def start_counting(self) -> None:
        pass

    def acceptance(self, answers: list[Answer]) -> tuple[float, int, dict | None]:
        return acceptance([a.meta for a in answers], self.url + "/generate")


_NO_VERIFY = "every answer ended at its first token (from prefill), so no verify step ran: raise --max-new-tokens"
_SAMPLE = re.compile(r'^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d+)"')
_DRAFTS, _ACCEPTED, _PER_POS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
                                "vllm:spec_decode_num_accepted_tokens_per_pos_total")


def vllm_counters(text: str, where=None) -> dict:
    """{"drafts", "accepted", "per_pos": {position: accepted}} summed over label sets; drafts None
    where /metrics (`where`) has no such counter (no --speculative-config, or --disable-log-stats)."""
    out = {"drafts": None, "accepted": 0.0, "per_pos": {}}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in (_DRAFTS, _ACCEPTED, _PER_POS):  # a non-Prometheus page: values float() refuses
            continue
        name, labels = m.group(1), m.group(2) or ""
        try:
            value = float(m.group(3))
        except ValueError:
            value = math.nan
        if not 0 <= value < math.inf:  # a counter: NaN (or text) would be priced as NaN drafts
            raise LabError(f"{name} is {m.group(3)[:50]}, not a count (a number >= 0)", where)
        if name == _DRAFTS:
            out["drafts"] = (out["drafts"] or 0.0) + value
        elif name == _ACCEPTED:
            out["accepted"] += value
        elif name == _PER_POS and (pos := _POSITION.search(labels)):
            out["per_pos"][int(pos.group(1))] = out["per_pos"].get(int(pos.group(1)), 0.0) + value
    return out


class VLLM:
    """vLLM's OpenAI-compatible API; acceptance from the /metrics counters."""

    def __init__(self, url: str, cfg: ServedConfig):
        self.url, self.cfg = url.rstrip("/"), cfg
        self.model = cfg.model
        self.before: dict | None = None

    def _model(self) -> str:
        if self.model is None:
            self.model = served_model(self.url, self.cfg.timeout_s, self.cfg.retries)
        return self.model

    def settings(self) -> dict:
        return {"model": self._model()}

    def generate(self, ids: list[int], max_new_tokens: int) -> Answer:
        endpoint, model, sent = self.url + "/v1/completions", self._model(), []
        return vllm_answer(stream_json(endpoint, {
            "model": model, "prompt": ids, "max_tokens": max_new_tokens, "temperature": self.cfg.temperature, **PLAIN,
            "stream": True, "stream_options": {"include_usage": True}},
            timeout_s=self.cfg.timeout_s, retries=self.cfg.retries, sent=sent), sent, endpoint)

    def _counters(self) -> dict:
        return vllm_counters(request_text(self.url + "/metrics", timeout_s=self.cfg.timeout_s,
                                          retries=self.cfg.retries), self.url + "/metrics")

    def speculates(self) -> bool | None:
        """Whether /metrics has the speculative counters (None: no /metrics to tell)."""
        try:
            return self._counters()["drafts"] is not None
        except HTTPStatusError:
            return None

    def start_counting(self) -> None:
        self.before = self._counters()
        if self.before["drafts"] is None:  # known now, not after every prompt has been decoded
            raise LabError(f"the server counted no speculative drafts (no {_DRAFTS} in /metrics): launch it with "
                           "--speculative-config, and without --disable-log-stats", self.url + "/metrics")

    def acceptance(self, answers: list[Answer]) -> tuple[float, int, dict | None]:
        after, before = self._counters(), self.before
        # a per-position counter gone back (or gone) would be a negative bar in the histogram
        if after["drafts"] is None or after["drafts"] < before["drafts"] or after["accepted"] < before["accepted"] \
                or any(after["per_pos"].get(j, -1.0) < n for j, n in before["per_pos"].items()):
            raise LabError("the speculative counters went back during the eval (the server restarted?), so the "
                           "accept length cannot be told: run the eval again", self.url + "/metrics")
        drafts = round(after["drafts"] - before["drafts"])
        if drafts <= 0 and all(a.tokens <= 1 for a in answers):
            raise LabError(_NO_VERIFY, self.url + "/metrics")
        if drafts <= 0:
            raise LabError(f"the server counted no speculative drafts during the eval (no {_DRAFTS} growth): its "
                           "drafter proposed none for these prompts", self.url + "/metrics")
        accepted = after["accepted"] - before["accepted"]
        per_pos = [round(after["per_pos"][j] - before["per_pos"].get(j, 0.0)) for j in sorted(after["per_pos"])]
        reached = [drafts, *per_pos, 0]  # drafts that accepted at least j drafts, j = 0, 1, ...
        hist = {str(j + 1): reached[j] - reached[j + 1] for j in range(len(per_pos) + 1)} if per_pos else None
        return 1 + accepted / drafts, drafts, hist


def arrival_times(n: int, rate: float | None, seed: int) -> list[float]:
    """Seconds after the start at which each of n requests arrives: the first at once, then gaps
    drawn from an exponential distribution of mean 1 / rate (a Poisson process); all at once
    without a rate."""
    if rate is None:
        return [0.0] * n
    rng, at = random.Random(seed), [0.0]
    for _ in range(n - 1):
        at.append(at[-1] + rng.expovariate(rate))
    return at


def _decode(server, prompts: list[list[int]], cfg: ServedConfig, speculative: bool,
            names: list[str] | None = None) -> tuple[list[Answer], float]:
    """Every prompt's answer and the wall seconds they took, after one warm-up request; only the
    speculative server's acceptance counters are read. Each request is sent once it has arrived and
    one of the `concurrency` slots is free; the first failure is raised as it comes, and no request
    is sent after it. A prompt the server refuses (a 400: past the context length) is named, from
    `names` (the conversations' ids), so that it can be shortened or left out."""
    try:
        server.generate(prompts[0], min(WARMUP_TOKENS, cfg.max_new_tokens))
    except HTTPStatusError as e:
        _refused(e, 0, prompts, cfg, names)
    if speculative:
        server.start_counting()
    label = "speculative" if speculative else "baseline"
    arrivals = arrival_times(len(prompts), cfg.request_rate, cfg.seed)
    answers: list = [None] * len(prompts)
    waiting, finished, stop = queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
    for i in range(len(prompts)):
        waiting.put(i)
    with progress(f"eval --server ({label})", total=len(prompts)) as advance:
        start = time.perf_counter()

        def slot() -> None:  # one of the `concurrency`: the waiting requests in turn, each once it arrived
            while True:
                try:
                    i = waiting.get_nowait()
                except queue.Empty:
                    return
                # Woken by another slot's failure too: no request is sent after one
                if stop.wait(max(0.0, start + arrivals[i] - time.perf_counter())):
                    return
                try:
                    finished.put((i, server.generate(prompts[i], cfg.max_new_tokens)))
                except Exception as e:
                    stop.set()  # before the next request this slot would take
                    finished.put((i, e))

        # Daemon threads: a failure (or Ctrl-C) abandons the requests in flight, which would
        # otherwise hold the exit for as long as the longest generation.
        # No more slots than prompts: the rest would find none waiting, yet each is started before the
        # answers are read, so the wall seconds (tok/s, requests in flight) counted every start.
        for _ in range(min(cfg.concurrency, len(prompts))):
            threading.Thread(target=slot, name="drafter-lab-eval", daemon=True).start()
        try:
            for _ in prompts:
                i, answer = finished.get()
                if isinstance(answer, HTTPStatusError):
                    _refused(answer, i, prompts, cfg, names)
                if isinstance(answer, Exception):
                    raise answer
                answers[i] = answer
                advance(1)
        finally:
            stop.set()
        seconds = time.perf_counter() - start
    if retried := sum(a.retries > 0 for a in answers):
        log(f"eval --server ({label}): {retried} of {len(answers)} requests were retried before their stream "
            "began (a refused connection or a 5xx); their TTFT counts from the try that was answered")
    return answers, seconds


def _refused(e: HTTPStatusError, i: int, prompts: list[list[int]], cfg: ServedConfig, names: list[str] | None):
    """Raise `e`, naming prompt i where the server refused it (400, 413, 422: not a 429, which is load)."""
    if e.status not in (400, 413, 422):
        raise e
    name = f"prompt {i}" + ("" if names is None else f" ({names[i]})")
    raise LabError(f"{name}, {len(prompts[i])} tokens + --max-new-tokens {cfg.max_new_tokens}, was refused (shorten or "
                   f"leave out that conversation, or lower --max-new-tokens if the context is full): {e}") from None


def _requests(answers: list[Answer]) -> dict[str, list[float]]:
    """Each request's TTFT and TPOT in ms, the streamed events that carried its tokens, and its retries."""
    out = {"ttft_ms": [], "tpot_ms": [], "chunks": [a.chunks for a in answers],
           "retries": [a.retries for a in answers]}
    for a in answers:
        add_request(out, a.first_s, a.last_s - a.first_s, a.tokens)
    return out


def _in_flight(answers: list[Answer], seconds: float) -> float:
    """Mean requests in flight over the decode (Little's law): each request's seconds, summed, over
    the wall seconds."""
    return sum(a.last_s for a in answers) / seconds


def acceptance(metas: list[dict], endpoint: str) -> tuple[float, int, dict | None]:
    """From SGLang meta_infos: (served accept length, verify steps, histogram {served length: verify
    steps} or None)."""
    if not any("spec_verify_ct" in m for m in metas):
        # no fields to tell spec from not
        if all(_count(m.get("completion_tokens") or 0, "meta_info.completion_tokens", endpoint) <= 1 for m in metas):
            raise LabError(_NO_VERIFY, endpoint)
        raise LabError("the server reports no speculative decoding (meta_info has no spec_verify_ct); launch "
                       "it with --speculative-algorithm EAGLE3 and a draft model", endpoint)
    # Recent SGLang writes the speculative fields only for a request that ran a verify step: one that
    # ended at its first token (an eos at once) has none.
    verified = [m for m in metas
                if _count(m.get("spec_verify_ct") or 0, "meta_info.spec_verify_ct", endpoint) > 0]
    verify = sum(int(m["spec_verify_ct"]) for m in verified)
    if verify == 0:
        raise LabError("the server ran no verify step: raise --max-new-tokens", endpoint)
    hist = None
    if all(isinstance(m.get("spec_accept_histogram"), list) for m in verified):
        width = max(len(m["spec_accept_histogram"]) for m in verified)
        counts = [sum(_count(m["spec_accept_histogram"][i], "meta_info.spec_accept_histogram", endpoint)
                      for m in verified if i < len(m["spec_accept_histogram"]))
                  for i in range(width)]
        hist = {str(i + 1): c for i, c in enumerate(counts)}  # i drafts accepted = i + 1 tokens emitted
    # Not the histogram's mean: SGLang counts a step's accepted drafts before it cuts the output at
    # max_new_tokens or an eos, and a request gets only the tokens completion_tokens counts
    tokens = sum(_count(m.get("completion_tokens"), "meta_info.completion_tokens", endpoint) - 1 for m in verified)
    return tokens / verify, verify, hist


def check_settings(cfg: ServedConfig) -> None:
    """`cfg`'s settings, refused before any request, one each with its value (`eval` names the flags that set
    them, before it reads the prompts)."""
    if cfg.engine not in ENGINES:
        raise LabError(f"unknown engine {cfg.engine!r}: use {' or '.join(ENGINES)}")
    if cfg.retries < 0:  # a refused connection would be retried forever
        raise LabError(f"retries must be >= 0, got {cfg.retries}")
    check_timeout(cfg.timeout_s)
    for name in ("concurrency", "max_new_tokens"):  # one each, with its value, as SpecConfig words them
        if getattr(cfg, name) < 1:
            raise LabError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.temperature < math.inf:  # nan too
        raise LabError(f"temperature must be a finite number >= 0, got {cfg.temperature}")
    if cfg.request_rate is not None and not 0 < cfg.request_rate < math.inf:
        raise LabError(f"the request rate must be a positive number of requests per second, got {cfg.request_rate}")
    for url in filter(None, (cfg.url, cfg.baseline_url)):  # the library's callers pass no argparse type
        if problem := url_problem(url):
            raise LabError(problem, url)
    if cfg.baseline_url is not None and _same_url(cfg.url, cfg.baseline_url):
        raise LabError(f"--baseline-server {cfg.baseline_url} is the --server itself: pass the same target served "
                       "without speculation")


def served_evaluate(tokenizer, conversations, cfg: ServedConfig, where=None, template_kwargs: dict | None = None) -> dict:
    """Decode every conversation's prompt on the server (and the baseline server); returns the numbers.
    The prompts are rendered here (`template_kwargs`: the chat template's variables) and sent as ids."""
    check_settings(cfg)
    engine = {"sglang": SGLang, "vllm": VLLM}[cfg.engine]
    prompts = render_prompts(tokenizer, conversations, where, template_kwargs)
    names = [c.id for c in conversations]
    server = engine(cfg.url, cfg)
    settings = server.settings()
    for key in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        if settings.get(key) is not None:  # read once the prompts are decoded: int("x") raised after them
            _count(settings[key], key, cfg.url.rstrip("/") + "/get_server_info")
    if cfg.baseline_url is not None and engine(cfg.baseline_url, cfg).speculates():  # its tok/s would be no baseline
        raise LabError("--baseline-server speculates (it reports speculative settings or counters): pass the same "
                       "target served without speculation", cfg.baseline_url)
    answers, seconds = _decode(server, prompts, cfg, speculative=True, names=names)
    accept, verify_steps, hist = server.acceptance(answers)
    if cfg.engine == "sglang":
        steps, topk = settings.get("speculative_num_steps"), settings.get("speculative_eagle_topk")
        # SGLang counts the verified root among its draft tokens; the lab's draft_tokens do not
        verified = settings.get("speculative_num_draft_tokens")
        draft_tokens = None if verified is None else int(verified) - 1
    else:  # vLLM drafts a chain of as many tokens as it has positions
        steps = None if hist is None else len(hist) - 1
        topk, draft_tokens = 1, steps
    if hist is not None and steps is not None:  # every depth the server could reach, zeros included
        hist = {str(n): hist.get(str(n), 0) for n in range(1, max(int(steps) + 2, len(hist) + 1))}
    tokens = sum(a.tokens for a in answers)
    requests = {"spec": _requests(answers), "baseline": _requests([])}
    result = {
        "served_accept_len": accept,
        "accept_length_kind": "served: tokens emitted per verify step, bonus included",
        "accept_histogram": hist,
        "verify_steps": verify_steps,
        "spec_tok_s": tokens / seconds,
        "spec_seconds": seconds,
        "spec_tokens": tokens,
        "prompts": len(prompts),
        "requests": requests,
        "in_flight": {"spec": _in_flight(answers, seconds), "baseline": None},
        "engine": cfg.engine,
        "server": cfg.url,
        "server_settings": settings,
        "config": {
            "steps": steps, "topk": topk, "draft_tokens": draft_tokens, "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature, "concurrency": cfg.concurrency, "request_rate": cfg.request_rate,
            "seed": cfg.seed,
            "drafting": None if topk is None else ("chain" if topk == 1 else "tree"),
            **rendered_with(tokenizer, template_kwargs),
        },
    }
    if cfg.baseline_url is not None:
        base, base_seconds = _decode(engine(cfg.baseline_url, cfg), prompts, cfg, speculative=False, names=names)
        base_tokens = sum(a.tokens for a in base)
        requests["baseline"] = _requests(base)
        result["in_flight"]["baseline"] = _in_flight(base, base_seconds)
        result.update(baseline_server=cfg.baseline_url, baseline_tok_s=base_tokens / base_seconds,
                      baseline_seconds=base_seconds, baseline_tokens=base_tokens,
                      speedup=result["spec_tok_s"] / (base_tokens / base_seconds))
        result["lossless_check"] = _compare([a.output for a in base], [a.output for a in answers], conversations,
                                            cfg.temperature)
    result["latency"] = latency(requests["spec"], requests["baseline"])
    return result


def _same_url(a: str, b: str) -> bool:
    """Whether two base URLs name the same server (case of scheme and host, a trailing slash, a default
    port, and localhost for 127.0.0.1 aside)."""
    def key(url: str):
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        host = {"localhost": "127.0.0.1", "::1": "127.0.0.1"}.get(parts.hostname or "", parts.hostname)
        return parts.scheme.lower(), host, parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower()), parts.path
    return key(a) == key(b)


def _compare(base: list, spec: list, conversations, temperature: float) -> str:
    if temperature > 0:
        return "skipped: sampling (temperature > 0)"
    differ = [(i, first_difference(list(a), list(b))) for i, (a, b) in enumerate(zip(base, spec)) if a != b]
    if not differ:
        return "identical"
    i, j = differ[0]
    return (f"{len(differ)} of {len(base)} prompts differ (first: prompt {i} ({conversations[i].id}) at "
            f"generated {'token' if isinstance(base[i], list) else 'character'} {j})")
