"""Decodes that would run past the models' max_position_embeddings, refused up front (session 68, h1)."""

from __future__ import annotations

import copy
import re

import pytest

from drafter_lab.data.chat import render
from drafter_lab.data.conversations import Conversation
from drafter_lab.errors import LabError
from drafter_lab.spec import engine as spec_engine
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.eval import evaluate, render_prompts
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.targets.hf import load_target


@pytest.fixture
def short_target(random_llama):
    """A target of its own (the session's stays as it is), whose limit a test sets."""
    return load_target(random_llama)


@pytest.fixture
def no_decode(monkeypatch):
    def decoded(*a, **k):
        raise AssertionError("decoded before the positions were checked")

    monkeypatch.setattr(spec_engine.SpecEngine, "generate", decoded)


def deepest_verified(engine: SpecEngine) -> list[int]:
    """The deepest position of each verify pass the engine's target runner makes (the real runner's)."""
    seen, verify = [], engine.target.verify

    def recording(tokens, depth, ancestors, aux=True):
        seen.append(int((engine.target.lens[:, None] + depth).max()))
        return verify(tokens, depth, ancestors, aux=aux)

    engine.target.verify = recording
    return seen


@pytest.mark.parametrize("steps", ["5000", "12345678901234567890"])
def test_eval_refuses_steps_past_the_targets_context(random_llama, drafter_dir, prompts_file, prompts, cli_error,
                                                     no_decode, steps):
    """--steps 5000 drafted and verified for minutes past the target's 1024 positions; 20 digits died in
    new_kv_cache with a TypeError. Refused in one line, naming the flags, the longest prompt and the limit."""
    longest = max(map(len, prompts))  # not the first prompt's
    assert longest > len(prompts[0])
    err = cli_error(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts",
                     str(prompts_file), "--steps", steps, "--max-new-tokens", "8"])
    assert err == (f"error: --steps {steps} with --max-new-tokens 8 takes the longest prompt ({longest} tokens) to "
                   f"position {longest + 8 + int(steps) - 2}, past the target's max_position_embeddings 1024")


def test_eval_refuses_max_new_tokens_past_the_context_with_ngram(random_llama, prompts_file, prompts, cli_error,
                                                                 no_decode):
    longest = max(map(len, prompts))
    err = cli_error(["eval", "--ngram", "--target", str(random_llama), "--prompts", str(prompts_file),
                     "--steps", "3", "--max-new-tokens", str(1024 - longest)])
    assert err == (f"error: --steps 3 with --max-new-tokens {1024 - longest} takes the longest prompt ({longest} "
                   f"tokens) to position 1025, past the target's max_position_embeddings 1024")


def test_the_limit_is_the_deepest_position_a_decode_verifies(short_target, random_drafter, prompts):
    """max_new_tokens 2: the one verify step comes with one token emitted, its root at len(prompt), the
    deepest draft `steps` further. A limit one past it decodes, and reaches it; at it, refused."""
    p = prompts[:1]
    cfg = SpecConfig(steps=3, max_new_tokens=2, stop_at_eos=False)
    last = len(p[0]) + 3
    short_target.config.max_position_embeddings = last + 1
    engine = SpecEngine(short_target, random_drafter, cfg)
    seen = deepest_verified(engine)
    assert len(engine.generate(p).tokens[0]) == 2
    assert seen == [last]
    # target-only: the root alone, one position before; the drafter's steps do not count
    short_target.config.max_position_embeddings = len(p[0]) + 1
    engine = SpecEngine(short_target, random_drafter, cfg)
    seen = deepest_verified(engine)
    engine.generate(p, speculative=False)
    assert seen == [len(p[0])]

    short_target.config.max_position_embeddings = last
    with pytest.raises(LabError, match=rf"^steps 3 with max_new_tokens 2 takes the longest prompt \({len(p[0])} "
                                       rf"tokens\) to position {last}, past the target's max_position_embeddings "
                                       rf"{last}$"):
        SpecEngine(short_target, random_drafter, cfg).generate(p)
    short_target.config.max_position_embeddings = len(p[0])
    with pytest.raises(LabError, match=rf"^max_new_tokens 2 takes the longest prompt \({len(p[0])} tokens\) to "
                                       rf"position {len(p[0])}, past the target's max_position_embeddings"):
        SpecEngine(short_target, random_drafter, cfg).generate(p, speculative=False)


def test_the_drafters_own_limit_binds_nothing(target, random_drafter, prompts):
    """An imported drafter may be made for fewer positions than its target (EAGLE-3 heads of 2048 on
    128k targets): its RoPE is computed for any position, and SGLang drafts past it, so the lab does too."""
    drafter = copy.deepcopy(random_drafter)
    drafter.config.max_position_embeddings = len(prompts[0])
    engine = SpecEngine(target, drafter, SpecConfig(steps=3, max_new_tokens=4, stop_at_eos=False))
    assert len(engine.generate(prompts[:1]).tokens[0]) == 4


def test_evaluate_checks_every_prompt_before_the_first_batch(short_target, random_drafter, conversations, prompts,
                                                             monkeypatch):
    """Batches decode one after another: the longest prompt's batch (the second) was refused after the
    first one's decode, and the warm-up decodes only the first batch's prompts at 8 tokens."""
    longest = max(map(len, prompts))
    short_target.config.max_position_embeddings = longest + 16 + 4 - 2
    calls = []
    monkeypatch.setattr(SpecEngine, "generate", lambda self, *a, **k: calls.append(a))
    with pytest.raises(LabError, match=rf"^steps 4 with max_new_tokens 16 takes the longest prompt \({longest} "):
        evaluate(short_target, random_drafter, conversations, steps=4, batch=1, max_new_tokens=16)
    assert calls == []


def test_a_target_whose_config_names_no_limit_is_not_refused(short_target, random_drafter, prompts):
    del short_target.config.max_position_embeddings
    engine = SpecEngine(short_target, random_drafter, SpecConfig(steps=2, max_new_tokens=2))
    assert len(engine.generate(prompts[:1]).tokens[0]) >= 1


def test_an_evals_progress_and_numbers_agree_with_each_other(target, conversations, capsys):
    """Mutation audit: the bar's total (2 x prompts: target-only, then speculative) and the accept length it
    shows; the rows per pass, rates, phases and latencies each side reports from its own decode."""
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:3], steps=3, batch=2, max_new_tokens=8)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval (target-only")]
    assert lines and all(re.fullmatch(r"eval \(target-only, speculative\): prompts \d/6 \[\d+ s\].*", line)
                         for line in lines), lines
    assert re.fullmatch(rf".* prompts 6/6 \[\d+ s\] accept={r['served_accept_len']:.4g}", lines[-1])
    # target-only, each (row, pass) of an unfinished row emits one token past the prefill's
    rows = r["live_rows_per_pass"]
    assert rows["baseline"] == (r["baseline_tokens"] - r["prompts"]) / r["decode_passes"] > 1
    assert rows["spec"] == r["verify_steps"] / r["verify_passes"]
    for side in ("spec", "baseline"):
        assert r[f"{side}_tok_s"] == r[f"{side}_tokens"] / r[f"{side}_seconds"]
        ttft = sorted(r["requests"][side]["ttft_ms"])
        assert len(ttft) == 3 and r["latency"][side]["ttft_ms"]["median"] == ttft[1]
    assert r["speedup"] == r["spec_tok_s"] / r["baseline_tok_s"]
    assert "draft" in r["phase_seconds"]["spec"] and "draft" not in r["phase_seconds"]["baseline"]


def test_a_prompt_is_the_turns_before_the_first_answer_or_through_the_first_question(target, tmp_path):
    """Mutation audit: an unanswered conversation (MT-bench's) keeps its system turn and first question
    only; which of the two refusals a conversation without a user turn gets, word for word; and none at all."""
    system, q1, q2 = ({"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"},
                      {"role": "user", "content": "and then?"})
    tok = target.tokenizer
    assert render_prompts(tok, [Conversation(id="m", messages=[system, q1, q2])]) == \
        [tok(render(tok, [system, q1], True), add_special_tokens=False)["input_ids"]]
    answered = Conversation(id="a", messages=[system, {"role": "assistant", "content": "hi"}, q1])
    with pytest.raises(LabError) as e:
        render_prompts(tok, [answered], tmp_path)
    assert str(e.value) == f"{tmp_path}: conversation a has no user turn before its first assistant turn"
    with pytest.raises(LabError) as e:
        render_prompts(tok, [Conversation(id="s", messages=[system])], tmp_path)
    assert str(e.value) == f"{tmp_path}: conversation s has no user turn"
    with pytest.raises(LabError) as e:  # else evaluate's refusal blamed --max-new-tokens
        render_prompts(tok, [], tmp_path)
    assert str(e.value) == f"{tmp_path}: no prompts to decode"


def test_evaluates_defaults_are_the_eval_commands(target, conversations):
    """Mutation audit: a library caller of `evaluate` decodes as `drafter-lab eval` does by default."""
    from drafter_lab import cli

    args = cli.build_parser().parse_args(["eval", "--ngram", "--target", "t", "--prompts", "p"])
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:1])
    c = r["config"]
    assert ([c["steps"]], [c["topk"]], [c["batch"]], c["schedule"], c["max_new_tokens"], c["temperature"], c["seed"]) \
        == (args.steps, args.topk, args.batch, args.schedule, args.max_new_tokens, args.temperature, args.seed)
    assert c["draft_tokens"] == c["steps"]
    # one row: each pass is one verify step of it (the counts start at none)
    assert r["verify_passes"] == r["verify_steps"] and r["decode_passes"] == r["baseline_tokens"] - 1
