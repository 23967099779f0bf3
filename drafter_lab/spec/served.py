"""`drafter-lab eval --server`: served accept length and tok/s from a running SGLang server.

The lab's own `eval` decodes with its engine; this one asks the engine people serve with. SGLang's
native `/generate` reports, per request, in `meta_info`: the tokens it emitted
(`completion_tokens`), its verify steps (`spec_verify_ct`) and, in recent versions, the verify
steps that accepted 0, 1, 2, ... drafts (`spec_accept_histogram`). The served accept length is
the lab's (tokens emitted per verify step, bonus included): from the histogram when the server
sends it, else (completion_tokens - 1) / spec_verify_ct per request summed, since each request's
first token comes from prefill, not from a verify step.

Prompts are rendered here with the target's chat template and sent as token ids, so the server
decodes exactly the tokens the lab's eval would. `/get_server_info` records the server's
speculative settings (and tells the cost model whether the histogram comes from a chain). With a
baseline server (the same target served without speculation) the same prompts run there too, so
both tok/s come from the same run, and greedy outputs are compared; a serving engine's batching
need not be bitwise deterministic, so a difference is reported, not raised.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from drafter_lab.errors import LabError
from drafter_lab.httpjson import request_json
from drafter_lab.progress import progress
from drafter_lab.spec.eval import WARMUP_TOKENS, first_difference, render_prompts


@dataclass
class ServedConfig:
    """Which servers to ask, and how."""

    url: str
    """Base URL of an SGLang server with speculative decoding (`--speculative-algorithm EAGLE3`)."""
    baseline_url: str | None = None
    """Base URL of the same target served without speculation: tok/s and greedy outputs are compared."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    temperature: float = 0.0
    """Sampling temperature sent with each request (0 = greedy)."""
    concurrency: int = 1
    """Requests in flight (1 = the latency-bound regime a drafter is for)."""
    timeout_s: float = 600.0
    """Seconds one request may take."""
    retries: int = 3
    """Retries of a request that failed to connect or got a 5xx answer."""


def server_settings(url: str, cfg: ServedConfig) -> dict:
    """The server's `speculative_*` settings from /get_server_info ({} where it has none)."""
    try:
        info = request_json(url.rstrip("/") + "/get_server_info", timeout_s=cfg.timeout_s, retries=0)
    except LabError:  # older servers, or another engine: the numbers stand without it
        return {}
    return {k: v for k, v in info.items() if k.startswith("speculative_")} if isinstance(info, dict) else {}


def _decode(url: str, prompts: list[list[int]], cfg: ServedConfig, label: str) -> tuple[list[dict], float]:
    """Every prompt's answer from `url` and the wall seconds they took, after one warm-up request."""
    endpoint = url.rstrip("/") + "/generate"

    def ask(ids: list[int], max_new_tokens: int) -> dict:
        answer = request_json(endpoint, {"input_ids": ids, "sampling_params": {
            "temperature": cfg.temperature, "max_new_tokens": max_new_tokens}},
            timeout_s=cfg.timeout_s, retries=cfg.retries)
        if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
            raise LabError(f"answer has no meta_info: {str(answer)[:200]}", endpoint)
        return answer

    ask(prompts[0], min(WARMUP_TOKENS, cfg.max_new_tokens))
    answers: list[dict] = []
    with progress(f"eval --server ({label})", total=len(prompts)) as advance, \
            ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="drafter-lab-eval") as pool:
        start = time.perf_counter()
        for answer in pool.map(lambda ids: ask(ids, cfg.max_new_tokens), prompts):
            answers.append(answer)
            advance(1)
        seconds = time.perf_counter() - start
    return answers, seconds


def acceptance(metas: list[dict], endpoint: str) -> tuple[float, int, dict | None]:
    """(served accept length, verify steps, histogram {served length: verify steps} or None)."""
    if not all("spec_verify_ct" in m for m in metas):
        raise LabError("the server reports no speculative decoding (meta_info has no spec_verify_ct); launch "
                       "it with --speculative-algorithm EAGLE3 and a draft model", endpoint)
    verify = sum(int(m["spec_verify_ct"]) for m in metas)
    if verify == 0:
        raise LabError("the server ran no verify step: raise --max-new-tokens", endpoint)
    if all(isinstance(m.get("spec_accept_histogram"), list) for m in metas):
        width = max(len(m["spec_accept_histogram"]) for m in metas)
        counts = [sum(int(m["spec_accept_histogram"][i]) for m in metas if i < len(m["spec_accept_histogram"]))
                  for i in range(width)]
        hist = {str(i + 1): c for i, c in enumerate(counts)}  # i drafts accepted = i + 1 tokens emitted
        return sum((i + 1) * c for i, c in enumerate(counts)) / sum(counts), sum(counts), hist
    tokens = sum(int(m["completion_tokens"]) - 1 for m in metas)
    return tokens / verify, verify, None


def _outputs(answers: list[dict]) -> list:
    return [a.get("output_ids", a.get("text")) for a in answers]


def served_evaluate(tokenizer, conversations, cfg: ServedConfig, where=None) -> dict:
    """Decode every conversation's prompt on the server (and the baseline server); returns the numbers."""
    if cfg.concurrency < 1 or cfg.max_new_tokens < 1 or cfg.temperature < 0:
        raise LabError("need concurrency >= 1, max_new_tokens >= 1 and temperature >= 0")
    prompts = render_prompts(tokenizer, conversations, where)
    settings = server_settings(cfg.url, cfg)
    answers, seconds = _decode(cfg.url, prompts, cfg, "speculative")
    accept, verify_steps, hist = acceptance([a["meta_info"] for a in answers], cfg.url.rstrip("/") + "/generate")
    steps, topk = settings.get("speculative_num_steps"), settings.get("speculative_eagle_topk")
    if hist is not None and steps is not None:  # every depth the server could reach, zeros included
        hist = {str(n): hist.get(str(n), 0) for n in range(1, max(int(steps) + 2, len(hist) + 1))}
    tokens = sum(int(a["meta_info"]["completion_tokens"]) for a in answers)
    result = {
        "served_accept_len": accept,
        "accept_length_kind": "served: tokens emitted per verify step, bonus included",
        "accept_histogram": hist,
        "verify_steps": verify_steps,
        "spec_tok_s": tokens / seconds,
        "spec_seconds": seconds,
        "spec_tokens": tokens,
        "prompts": len(prompts),
        "server": cfg.url,
        "server_settings": settings,
        "config": {
            "steps": steps, "topk": topk, "draft_tokens": settings.get("speculative_num_draft_tokens"),
            "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "concurrency": cfg.concurrency,
            "drafting": None if topk is None else ("chain" if topk == 1 else "tree"),
        },
    }
    if cfg.baseline_url is not None:
        base, base_seconds = _decode(cfg.baseline_url, prompts, cfg, "baseline")
        base_tokens = sum(int(a["meta_info"]["completion_tokens"]) for a in base)
        result.update(baseline_server=cfg.baseline_url, baseline_tok_s=base_tokens / base_seconds,
                      baseline_seconds=base_seconds, baseline_tokens=base_tokens,
                      speedup=result["spec_tok_s"] / (base_tokens / base_seconds))
        result["lossless_check"] = _compare(_outputs(base), _outputs(answers), conversations, cfg.temperature)
    return result


def _compare(base: list, spec: list, conversations, temperature: float) -> str:
    if temperature > 0:
        return "skipped: sampling (temperature > 0)"
    differ = [(i, first_difference(list(a), list(b))) for i, (a, b) in enumerate(zip(base, spec)) if a != b]
    if not differ:
        return "identical"
    i, j = differ[0]
    return (f"{len(differ)} of {len(base)} prompts differ (first: prompt {i} ({conversations[i].id}) at "
            f"generated {'token' if isinstance(base[i], list) else 'character'} {j})")
