"""Pins from the s67 (h4) mutation audit of spec/accept.py, spec/sweep.py and spec/eval.py: an accept length
no decode can emit is refused rather than left out of the histogram; a sampled walk that accepts every
draft still draws its bonus at the deepest node; a two-token request has a time per output token, and a
later static batch's requests arrived when their side's first batch began; pooled prompt sets weigh each set
by its own verify steps, passes and seconds; a sweep says which settings it leaves out and which a journal
already holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.spec.accept import accept_summary, sampled_walk
from drafter_lab.spec.eval import _add_requests, add_request, draft_step_us, latency, pool
from drafter_lab.spec.sweep import grid, run_sweep
from drafter_lab.spec.tree import padded_tree


@pytest.mark.parametrize("lengths, bad", [([1, 2, 4], 4), ([0, 1], 0), ([2, -1], -1)])
def test_an_accept_length_outside_what_a_step_can_emit_is_refused(lengths, bad):
    """At most 3 tokens a step (2 drafts and the bonus), at least the bonus: a 4 was left out of the histogram
    (which then counted 2 of 3 verify steps) while the mean counted it."""
    with pytest.raises(LabError, match=f"^served accept length {bad} is outside 1..3: a verify step emits the bonus "
                                       "token and at most 2 accepted drafts$"):
        accept_summary(lengths, 3)


def test_the_histogram_counts_every_verify_step_at_both_ends():
    s = accept_summary([1, 3, 3], 3)
    assert s["histogram"] == {"1": 1, "2": 0, "3": 2} and sum(s["histogram"].values()) == s["verify_steps"] == 3


def test_a_sampled_walk_through_the_deepest_draft_draws_its_bonus_there():
    """Root 3 -> 0 -> 1, both drafts certain: the bonus is the deepest node's token (2), drawn after the last
    draft level, not the 0 the bonus starts as."""
    rows = 2  # fewer rows than levels: the walk's levels are the tree's, not the batch's
    tree = padded_tree(torch.full((rows,), 3), [[(0, 0), (1, 1)]] * rows, pad_id=0)
    probs = torch.eye(4)[[0, 1, 2]].expand(rows, 3, 4).clone()  # at node i the target emits token i
    path, counts, bonus = sampled_walk(tree, probs, torch.Generator().manual_seed(0))
    assert path.tolist() == [[0, 1, 2]] * rows and counts.tolist() == [3] * rows and bonus.tolist() == [2] * rows


def test_a_two_token_request_has_a_time_per_output_token():
    into = {"ttft_ms": [], "tpot_ms": []}
    add_request(into, 0.1, 0.02, 2)  # the second token came 20 ms after the first
    assert into["tpot_ms"] == [pytest.approx(20.0)]


def test_a_later_batchs_requests_waited_for_the_batches_before_them():
    """The side's decodes so far took 2 s: this batch's first token 0.5 s in is a 2.5 s TTFT, and its 3 tokens,
    the last 1 s after the first, are 500 ms apart."""
    into = {"ttft_ms": [], "tpot_ms": []}
    g = SimpleNamespace(tokens=[[1, 2, 3], [4]], first_token_seconds=[0.5, 1.0], finish_seconds=[1.5, 1.0])
    _add_requests(into, g, 2.0)
    assert into == {"ttft_ms": [pytest.approx(2500.0), pytest.approx(3000.0)], "tpot_ms": [pytest.approx(500.0)]}


def test_the_tpot_ratio_is_the_target_only_median_over_the_speculative_one():
    lat = latency({"ttft_ms": [1.0], "tpot_ms": [2.0, 4.0, 6.0]}, {"ttft_ms": [1.0], "tpot_ms": [8.0, 12.0]})
    assert lat["tpot_speedup"] == pytest.approx(10.0 / 4.0)


def test_host_drafting_time_is_spread_over_the_draft_tokens_of_the_passes_that_drafted():
    assert draft_step_us(0.003, 10, 3) == pytest.approx(100.0)  # 3 ms over 10 passes x 3 steps
    assert draft_step_us(0.002, 0, 4) == pytest.approx(2000.0)  # no pass drafted: the time, not a ZeroDivisionError


def _ngram_set(accept: float, steps: int, hist: dict, passes: int, no_draft: float, draft_s: float,
               seconds: float, tpot: list[float]) -> dict:
    return {"served_accept_len": accept, "verify_steps": steps, "accept_histogram": hist, "prompts": 2,
            "verify_passes": passes, "decode_passes": passes + 2, "draft_seconds": draft_s, "no_draft_share": no_draft,
            "draft_step_us": 0.0, "config": {"steps": 2},
            "phase_seconds": {"spec": {"draft": draft_s, "verify": seconds}, "baseline": {"verify": seconds}},
            "requests": {"spec": {"ttft_ms": [1.0], "tpot_ms": tpot}, "baseline": {"ttft_ms": [1.0], "tpot_ms": [6.0]}}}


def test_pooled_sets_weigh_each_set_by_its_own_steps_passes_and_seconds():
    a = _ngram_set(2.0, 10, {"1": 4, "2": 6}, 10, 0.2, 0.01, 1.0, [2.0])  # no "3": a length it never reached
    b = _ngram_set(3.0, 30, {"1": 0, "2": 10, "3": 20}, 30, 0.5, 0.05, 3.0, [4.0, 4.0])
    out = pool({"a": a, "b": b})
    assert out["served_accept_len"] == pytest.approx((2.0 * 10 + 3.0 * 30) / 40) and out["verify_steps"] == 40
    assert out["accept_histogram"] == {"1": 4, "2": 16, "3": 20}
    assert pool({"a": a, "b": dict(b, accept_histogram=None)})["accept_histogram"] is None  # a server without one
    assert (out["prompts"], out["verify_passes"], out["decode_passes"]) == (4, 40, 44)
    # 2 + 15 passes drafted nothing: the 60 ms of lookups are spread over the other 23 passes' 2 steps each
    assert out["no_draft_share"] == pytest.approx(17 / 40)
    assert out["draft_step_us"] == pytest.approx(1e6 * 0.06 / (23 * 2))
    assert out["phase_seconds"] == {"spec": {"draft": pytest.approx(0.06), "verify": 4.0}, "baseline": {"verify": 4.0}}
    assert out["requests"]["spec"]["tpot_ms"] == [2.0, 4.0, 4.0] and out["latency"]["tpot_speedup"] == 1.5
    assert out["sets"] == {"a": a, "b": b}


def test_a_sweep_names_the_setting_it_leaves_out_and_why(capsys):
    assert [g["draft_tokens"] for g in grid([2], [2], [6, 7])] == [6]
    assert "sweep: leaving out steps 2, topk 2, draft tokens 7: draft_tokens must be in 1..6" in capsys.readouterr().err


def test_a_resumed_sweep_says_how_many_settings_its_journal_holds(tmp_path, capsys):
    settings = [{"steps": s} for s in (2, 4)]
    assert run_sweep(settings, lambda s: {"got": s["steps"]}) == [{"got": 2}, {"got": 4}]  # no journal: no resume
    assert capsys.readouterr().err == ""
    path = tmp_path / "sweep.json.partial"
    with Journal(path, {"seed": 0}) as journal:
        run_sweep(settings[:1], lambda s: {"got": s["steps"]}, journal)
    with Journal(path, {"seed": 0}) as journal:
        assert run_sweep(settings, lambda s: {"got": s["steps"]}, journal) == [{"got": 2}, {"got": 4}]
    assert f"sweep: 1 of 2 settings already decoded ({path})" in " ".join(capsys.readouterr().err.split())
