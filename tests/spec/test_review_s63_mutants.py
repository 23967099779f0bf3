"""Mutation audit (review s63): served eval's speedup, requests in flight and histogram depths; TPOT's
divisor; pooled requests in flight and tok/s; the all-reduce a measured verify is split at; the
histogram's bound; a what-if all-reduce's speedup."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec import served
from drafter_lab.spec.costinputs import accept_by_steps
from drafter_lab.spec.costmodel import CostModel, CostModelConfig, on_allreduce
from drafter_lab.spec.costreport import steps_table
from drafter_lab.spec.eval import add_request, pool


def test_tpot_divides_the_decode_time_by_the_tokens_after_the_first():
    """The first token is the TTFT's: 11 tokens whose last came 1 s after the first are 100 ms apart."""
    into = {"ttft_ms": [], "tpot_ms": []}
    add_request(into, 0.25, 1.0, 11)
    add_request(into, 0.5, 0.0, 1)  # one token: a TTFT, no TPOT
    assert into == {"ttft_ms": [250.0, 500.0], "tpot_ms": [pytest.approx(100.0)]}


def test_pooled_requests_in_flight_weigh_each_set_by_its_seconds():
    """Little's law over both sets: (2 x 1 s + 1 x 3 s) / 4 s, not the sets' plain mean."""
    def one(in_flight: float, seconds: float) -> dict:
        return {"served_accept_len": 2.0, "verify_steps": 1, "accept_histogram": None,
                "in_flight": {"spec": in_flight, "baseline": None}, "spec_seconds": seconds, "baseline_seconds": 1.0}

    out = pool({"a": one(2.0, 1.0), "b": one(1.0, 3.0)})
    assert out["in_flight"] == {"spec": pytest.approx(1.25), "baseline": None}


class _Server:
    """A speculative (or baseline) SGLang server as served_evaluate sees it: chain of 3 steps, and a
    histogram that never reached the deepest length."""

    def __init__(self, url, cfg):
        self.url = url

    def settings(self) -> dict:
        return {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}

    def speculates(self) -> bool:
        return False

    def acceptance(self, answers) -> tuple[float, int, dict]:
        return 2.0, 5, {"1": 2, "2": 3}


def test_served_speedup_and_in_flight_use_each_sides_own_seconds(monkeypatch):
    """Speculative: 2 x 10 tokens in 2 s; baseline: the same tokens in 4 s, so 2x. Each request spent 1.5 s
    from sending to its last token: 3 request-seconds over 2 s (spec) and 4 s (baseline) of wall time. The
    histogram lists every served length the 3-step chain could reach (1..4), a zero for 3 and 4."""
    def decode(server, prompts, cfg, speculative, names=None):
        answers = [served.Answer([1] * 10, 10, {}, 0.5, 1.5, 10) for _ in prompts]
        return answers, 2.0 if speculative else 4.0

    monkeypatch.setattr(served, "SGLang", _Server)
    monkeypatch.setattr(served, "_decode", decode)
    monkeypatch.setattr(served, "render_prompts", lambda *a, **k: [[1, 2], [3, 4]])
    monkeypatch.setattr(served, "rendered_with", lambda *a, **k: {})
    conversations = [SimpleNamespace(id="a"), SimpleNamespace(id="b")]
    cfg = served.ServedConfig(url="http://spec:1", baseline_url="http://base:2")
    r = served.served_evaluate(None, conversations, cfg)
    assert (r["spec_tok_s"], r["baseline_tok_s"], r["speedup"]) == (10.0, 5.0, 2.0)
    assert r["in_flight"] == {"spec": 1.5, "baseline": 0.75}
    assert r["accept_histogram"] == {"1": 2, "2": 3, "3": 0, "4": 0}
    assert r["config"]["draft_tokens"] == 3


def test_a_measured_verify_is_split_at_the_all_reduce_of_its_own_tokens():
    """verify_ms measured at 4 tokens, then an eval's 8-token verify: the measurement's all-reduces are
    those of a 4-token message (100 us), so the 4-token deployment reproduces its 30 ms."""
    cfg = CostModelConfig(measured_verify_ms=30.0, verify_compute_tokens=4, verify_tokens=8)
    table = {4 * 7168 * 2: 100.0, 8 * 7168 * 2: 150.0}
    out = on_allreduce(cfg, table)
    assert out.measured_verify_ms == 0 and out.verify_layer_compute_us == pytest.approx((30000 - 122 * 100) / 61)
    assert CostModel(dataclasses.replace(out, verify_tokens=4)).verify_ms(table) == pytest.approx(30.0)


def test_an_accept_length_one_past_the_chain_is_refused(tmp_path):
    """3 steps emit at most 4 tokens a verify step (3 drafts and the bonus): a 5 is refused, a 4 taken."""
    assert accept_by_steps({"1": 1, "4": 1}, tmp_path, steps=3) == pytest.approx([1.5, 2.0, 2.5])
    with pytest.raises(LabError, match="served accept length of 5, above config.steps \\+ 1 = 4"):
        accept_by_steps({"1": 1, "5": 1}, tmp_path, steps=3)


def test_pooled_tok_s_is_all_tokens_over_all_seconds():
    """Two prompt sets: 100 tokens in 1 s and 300 in 5 s speculative, 100 in 2 s and 300 in 6 s plain;
    pooled, 400 / 6 s against 400 / 8 s, not the first set's figures."""
    def one(spec, base) -> dict:
        return {"served_accept_len": 2.0, "verify_steps": 1, "accept_histogram": None,
                "spec_tokens": spec[0], "spec_seconds": spec[1], "spec_tok_s": spec[0] / spec[1],
                "baseline_tokens": base[0], "baseline_seconds": base[1], "baseline_tok_s": base[0] / base[1],
                "speedup": (spec[0] / spec[1]) / (base[0] / base[1])}

    out = pool({"a": one((100, 1.0), (100, 2.0)), "b": one((300, 5.0), (300, 6.0))})
    assert (out["spec_tok_s"], out["baseline_tok_s"]) == (pytest.approx(400 / 6), pytest.approx(50.0))
    assert out["speedup"] == pytest.approx(8 / 6)


def test_a_what_if_all_reduce_speeds_up_plain_decoding_too_in_the_speedup():
    """At an 8 us all-reduce, faster than the decode's 59, the speedup divides by plain decoding at 8 us
    as well (like with like), not by the deployment's own decode step."""
    cfg = CostModelConfig(accept_by_steps=[1.5, 2.0])
    for s, row in enumerate(steps_table(cfg, 8.0), start=1):
        m = CostModel(cfg).at_steps(s)
        assert row["speedup"] == pytest.approx(m.spec_tok_s(row["accept"], 8.0) / m.baseline_tok_s(8.0))
        assert m.baseline_tok_s(8.0) > m.baseline_tok_s()  # the case the two readings part on
