"""Served eval review (s59): SGLang's accept length counts the tokens a request got, not the drafts
its last verify step accepted past max_new_tokens or an eos; a /metrics page that is no Prometheus
text is no ValueError traceback."""

from __future__ import annotations

from drafter_lab.spec.served import acceptance, vllm_counters


def test_sglang_accept_length_leaves_out_drafts_accepted_past_the_end():
    # SGLang's verify counts each step's accepted drafts (spec_accept_histogram) before it cuts the
    # output at max_new_tokens or an eos: request 0 got 4 tokens, the prefill's and 3 from its one
    # verify step, which accepted 4 drafts. completion_tokens counts only what it emitted.
    metas = [{"completion_tokens": 4, "spec_verify_ct": 1, "spec_accept_histogram": [0, 0, 0, 0, 1]},
             {"completion_tokens": 9, "spec_verify_ct": 3, "spec_accept_histogram": [1, 0, 1, 1]}]
    accept, steps, hist = acceptance(metas, "url")
    assert (accept, steps) == ((3 + 8) / 4, 4)  # as without a histogram, and as the lab's engine counts
    assert hist == {"1": 1, "2": 0, "3": 1, "4": 1, "5": 1}  # the server's own counts


def test_vllm_metrics_that_are_no_prometheus_text_are_no_traceback():
    # a gateway's page answered at /metrics: its lines looked like samples whose values are no numbers
    page = "<html>\nbody { width: 35em;\nError: not found\nvllm:spec_decode_num_drafts_total 12.0\n"
    assert vllm_counters(page) == {"drafts": 12.0, "accepted": 0.0, "per_pos": {}}
    assert vllm_counters("Service Unavailable: try later\n")["drafts"] is None  # "no speculative drafts", one line
