"""evaluate() on the tiny shared target with an untrained drafter: its defaults, its refusals, how it
splits the prompts into decodes, what it adds up from each decode, and the lossless check's message.

Each decode is recorded (a wrapper around SpecEngine.generate) and the clock evaluate reads is a fake
one that ticks 1 s a call, so every number evaluate reports is checked against exact sums."""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from drafter_lab.data.conversations import Conversation
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.spec import eval as spec_eval
from drafter_lab.spec.accept import accept_summary
from drafter_lab.spec.eval import draft_step_us, evaluate
from drafter_lab.spec.ngram import NgramConfig, NgramDrafter
from drafter_lab.spec.phases import add as add_phases


@pytest.fixture
def decodes(monkeypatch):
    """Every generate call as (engine, prompts, speculative, slots, generation); evaluate's clock ticks 1 s a read."""
    calls = []
    real = spec_eval.SpecEngine.generate

    def record(self, prompts, *, speculative=True, **kw):
        asked = [list(p) for p in prompts]
        g = real(self, prompts, speculative=speculative, **kw)
        calls.append((self, asked, speculative, kw.get("slots"), g))
        return g

    monkeypatch.setattr(spec_eval.SpecEngine, "generate", record)
    clock = itertools.count(1.0)
    monkeypatch.setattr(spec_eval, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    return calls


def test_the_defaults_are_a_greedy_chain_of_4_one_prompt_at_a_time(target, random_drafter, conversations):
    r = evaluate(target, random_drafter, conversations[:1])
    config = {k: r["config"][k] for k in ("steps", "topk", "batch", "schedule", "max_new_tokens", "temperature",
                                          "seed", "drafting", "drafter")}
    assert config == {"steps": 4, "topk": 1, "batch": 1, "schedule": "static", "max_new_tokens": 64,
                      "temperature": 0.0, "seed": 0, "drafting": "chain", "drafter": "EAGLE-3"}
    assert r["lossless_check"] == "identical" and r["prompts"] == 1
    assert "draft_seconds" not in r and "no_draft_share" not in r  # host drafting time is the n-gram's alone


@pytest.mark.parametrize("batch", [0, -1])
def test_a_batch_below_one_is_refused(target, random_drafter, conversations, batch):
    with pytest.raises(LabError, match=rf"^batch must be >= 1, got {batch}$"):
        evaluate(target, random_drafter, conversations[:1], batch=batch, max_new_tokens=4)


def test_a_drafter_that_does_not_fit_is_refused_before_decoding(target, conversations, decodes):
    bad = Eagle3Drafter(DrafterConfig.for_target(target.config, 32, [2, 4, 5]))
    with torch.no_grad():
        bad.d2t.fill_(target.vocab_size)  # maps draft ids past the target vocab
    with pytest.raises(LabError, match="d2t maps"):
        evaluate(target, bad, conversations[:1], max_new_tokens=4)
    assert decodes == []


def test_a_prompt_too_long_for_the_target_is_refused_before_any_decoding(
        target, random_drafter, conversations, decodes):
    """The long prompt comes after one the warm-up and the first batch would decode."""
    long = Conversation(id="long", messages=[{"role": "user", "content": "x " * 1100}])
    with pytest.raises(LabError, match="past the target's max_position_embeddings 1024"):
        evaluate(target, random_drafter, [conversations[0], long], max_new_tokens=4)
    assert decodes == []


def _check_sums(r, decodes, prompts, *, steps, max_new_tokens, batch):
    """The warm-up (the first `batch` prompts, target-only then speculative, up to 8 tokens), then
    the measured decodes, whose numbers r must add up exactly (each decode: 1 s on the fake clock)."""
    warm, measured = decodes[:2], decodes[2:]
    assert [(c[1], c[2]) for c in warm] == [(prompts[:batch], False), (prompts[:batch], True)]
    assert {c[0].cfg.max_new_tokens for c in warm} == {min(8, max_new_tokens)}
    assert all(c[0].cfg.max_new_tokens == max_new_tokens and c[0].cfg.steps == steps for c in measured)
    side = {s: [c[4] for c in measured if c[2] == s] for s in (False, True)}
    assert [c[2] for c in measured] == [False, True] * len(side[True])  # alternating, target-only first
    for s, name in ((True, "spec"), (False, "baseline")):
        gs = side[s]
        tokens = sum(len(t) for g in gs for t in g.tokens)
        assert r[f"{name}_tokens"] == tokens and r[f"{name}_seconds"] == len(gs)
        assert r[f"{name}_tok_s"] == tokens / len(gs)
        ttft = [1e3 * (k + first) for k, g in enumerate(gs) for first in g.first_token_seconds]
        tpot = [1e3 * (last - first) / (len(t) - 1) for g in gs
                for t, first, last in zip(g.tokens, g.first_token_seconds, g.finish_seconds) if len(t) > 1]
        assert r["requests"][name] == {"ttft_ms": pytest.approx(ttft), "tpot_ms": pytest.approx(tpot)}
        phases = {}
        for g in gs:
            phases = add_phases(phases, g.phase_seconds)
        assert r["phase_seconds"][name] == pytest.approx(phases) and phases
    assert r["speedup"] == r["spec_tok_s"] / r["baseline_tok_s"]
    spec, base = side[True], side[False]
    accept = [n for g in spec for n in g.accept_lengths]
    verify = sum(g.verify_passes for g in spec)
    decode = sum(g.verify_passes for g in base)
    assert r["verify_passes"] == verify and r["decode_passes"] == decode
    assert r["live_rows_per_pass"] == {"spec": len(accept) / verify,
                                       "baseline": sum(len(g.accept_lengths) for g in base) / decode}
    summary = accept_summary(accept, steps + 1)
    assert r["accept_histogram"] == summary["histogram"] and r["served_accept_len"] == summary["served_accept_len"]
    return spec


@pytest.mark.parametrize("batch", [1, 2])
def test_the_static_schedule_decodes_batch_after_batch_and_adds_them_up(
        target, random_drafter, conversations, prompts, decodes, batch):
    r = evaluate(target, random_drafter, conversations[:3], steps=2, batch=batch, max_new_tokens=5)
    chunks = [prompts[i: min(i + batch, 3)] for i in range(0, 3, batch)]
    assert [c[1] for c in decodes[2:]] == [c for c in chunks for _ in range(2)]
    assert {c[3] for c in decodes} == {None}
    _check_sums(r, decodes, prompts, steps=2, max_new_tokens=5, batch=batch)
    assert r["config"]["schedule"] == "static" and r["config"]["batch"] == batch and r["prompts"] == 3


def test_the_continuous_schedule_decodes_every_prompt_in_batch_slots(
        target, random_drafter, conversations, prompts, decodes):
    r = evaluate(target, random_drafter, conversations[:3], steps=2, batch=2, continuous=True, max_new_tokens=5)
    assert [(c[1], c[3]) for c in decodes[2:]] == [(prompts[:3], 2)] * 2
    assert [c[3] for c in decodes[:2]] == [None, None]  # the warm-up is a plain batch
    _check_sums(r, decodes, prompts, steps=2, max_new_tokens=5, batch=2)
    assert r["config"]["schedule"] == "continuous" and r["live_rows_per_pass"]["baseline"] <= 2


@pytest.mark.parametrize("n, max_new_tokens", [(1, 2), (2, 12)])
def test_ngram_drafting_reports_its_host_time_over_the_measured_rows_only(
        target, conversations, prompts, decodes, n, max_new_tokens):
    """At 2 new tokens one prompt makes one pass a side: no share or rate is spread over a pass that did not run."""
    drafter = NgramDrafter(NgramConfig(1, 3, across_prompts=True))
    r = evaluate(target, drafter, conversations[:n], steps=3, max_new_tokens=max_new_tokens)
    spec = _check_sums(r, decodes, prompts, steps=3, max_new_tokens=max_new_tokens, batch=1)
    verify = sum(g.verify_passes for g in spec)
    no_draft = sum(g.no_draft_passes for g in spec)
    assert max_new_tokens > 2 or verify == r["decode_passes"] == 1
    assert r["no_draft_share"] == no_draft / verify
    assert r["draft_seconds"] == r["phase_seconds"]["spec"]["draft"]
    assert r["draft_step_us"] == draft_step_us(r["draft_seconds"], verify - no_draft, 3)
    assert r["config"]["drafter"] == "n-gram lookup (1..3, across prompts)"
    assert len(drafter.earlier.row_ends) == n  # the measured rows, not the warm-up's


def test_a_tree_and_a_sampled_decode_are_named_so(target, random_drafter, conversations):
    r = evaluate(target, random_drafter, conversations[:1], steps=2, topk=2, draft_tokens=4, max_new_tokens=4)
    assert r["config"]["drafting"] == "tree" and r["lossless_check"] == "identical"
    # sampled: the two sides draw differently, so their outputs need not (and here do not) agree
    r = evaluate(target, random_drafter, conversations[:2], steps=2, max_new_tokens=8, temperature=1.0, seed=3)
    assert r["lossless_check"] == "skipped: sampling (temperature > 0)" and r["config"]["seed"] == 3


def test_a_decode_with_no_verify_step_is_refused(target, random_drafter, conversations, tmp_path):
    with pytest.raises(LabError, match=r"prompts\.jsonl: no verify step ran"):
        evaluate(target, random_drafter, conversations[:1], max_new_tokens=1, where=tmp_path / "prompts.jsonl")


@pytest.mark.parametrize("change", ["token", "longer", "shorter"])
def test_the_lossless_check_names_the_prompts_file_the_prompt_the_position_and_both_tokens(
        target, random_drafter, conversations, monkeypatch, tmp_path, change):
    real = spec_eval.SpecEngine.generate
    base = []  # the measured target-only outputs (the warm-up's decode 8 tokens, these 10)

    def corrupt(self, prompts, *, speculative=True, **kw):
        g = real(self, prompts, speculative=speculative, **kw)
        if self.cfg.max_new_tokens == 10 and not speculative:
            base.append(g.tokens[0])
        elif self.cfg.max_new_tokens == 10 and len(base) == 2:  # the second prompt's speculative decode
            row = g.tokens[0] = list(g.tokens[0])
            if change == "token":
                row[2] += 1
            elif change == "longer":
                row.append(7)
            else:
                row.pop()
        return g

    monkeypatch.setattr(spec_eval.SpecEngine, "generate", corrupt)
    where = tmp_path / "prompts.jsonl"
    with pytest.raises(LabError) as e:
        evaluate(target, random_drafter, conversations[:2], steps=2, max_new_tokens=10, where=where)
    row = base[1]
    j, found = {"token": (2, f"target-only {row[2]}, speculative {row[2] + 1}"),
                "longer": (len(row), "target-only end, speculative 7"),
                "shorter": (len(row) - 1, f"target-only {row[-1]}, speculative end")}[change]
    assert str(e.value) == f"{where}: lossless check failed: prompt 1 (c1) differs at generated token {j}: {found}"


@pytest.mark.parametrize("n, max_new_tokens", [(2, 6), (1, 2)])  # (1, 2): a single accept length
def test_the_progress_line_counts_each_prompt_once_a_side_and_shows_the_accept_length(
        target, random_drafter, conversations, capsys, n, max_new_tokens):
    r = evaluate(target, random_drafter, conversations[:n], steps=2, max_new_tokens=max_new_tokens)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"eval (target-only, speculative): prompts {2 * n}/{2 * n} [")
    assert last.endswith(f" s] accept={r['served_accept_len']:.4g}")
