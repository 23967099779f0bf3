"""Mutation audit of spec/eval.py (session 75, h11): only an n-gram eval reports its host drafting time,
which `costmodel --inputs` reads; an EAGLE-3 drafter's CPU time would replace a deployment's GPU draft step."""

from __future__ import annotations

from drafter_lab.spec.eval import evaluate
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig

HOST_DRAFT = ("draft_seconds", "no_draft_share", "draft_step_us")


def test_an_eagle_eval_reports_no_host_drafting_time(target, random_drafter, conversations):
    r = evaluate(target, random_drafter, conversations[:1], steps=2, max_new_tokens=4)
    assert r["config"]["drafter"] == "EAGLE-3"
    assert "draft" in r["phase_seconds"]["spec"]  # it drafted: its time is in the phases, not an input
    assert [k for k in HOST_DRAFT if k in r] == []


def test_an_ngram_eval_reports_its_host_drafting_time(target, conversations):
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:1], steps=2, max_new_tokens=4)
    assert r["config"]["drafter"] == "n-gram lookup (1..3)"
    assert [k for k in HOST_DRAFT if k in r] == list(HOST_DRAFT)


def test_the_continuous_schedule_keeps_at_most_batch_rows_in_flight(target, conversations):
    """4 prompts at batch 2: two rows a pass on each side (without the slots, all 4 decoded at once)."""
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:4], steps=2, batch=2, continuous=True,
                 max_new_tokens=6)
    assert r["config"]["schedule"] == "continuous"
    assert 1 < r["live_rows_per_pass"]["baseline"] <= 2 and r["live_rows_per_pass"]["spec"] <= 2
