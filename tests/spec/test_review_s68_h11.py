"""Mutation audit of spec/eval.py, third pass (session 68, h11): the prompt's ids under a tokenizer that
adds a BOS, the n-gram eval's share of passes with nothing to draft, the lossless check's message, and
each side's own token count."""

from __future__ import annotations

import pytest
from tokenizers import processors

from drafter_lab.errors import LabError
from drafter_lab.spec import eval as spec_eval
from drafter_lab.spec.eval import evaluate, render_prompts
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.targets.hf import load_tokenizer


def test_a_tokenizer_that_adds_a_bos_renders_the_same_prompt_ids(random_llama, conversations, prompts):
    """The chat template already writes the prompt's first token (Llama 3's writes its BOS): a tokenizer
    that also adds one on encoding must not double it, or every eval prompt is one no server sends."""
    tok = load_tokenizer(random_llama)  # its own: the session's target keeps its tokenizer as it is
    first = prompts[0][0]  # the template's opening token, <|im_start|>, standing for a BOS
    name = tok.convert_ids_to_tokens(first)
    tok._tokenizer.post_processor = processors.TemplateProcessing(single=f"{name} $A",
                                                                  special_tokens=[(name, first)])
    assert tok("a")["input_ids"] == [first, *tok("a", add_special_tokens=False)["input_ids"]]
    assert render_prompts(tok, conversations) == prompts


class _DraftsOnFirstPass(NgramDrafter):
    """Drafts (token 0 at every step) on each row's first pass only: its later lookups find nothing."""

    def continuations(self, index, tokens, steps, k):
        if getattr(index, "drafted", False):
            return []
        index.drafted = True
        return [[0] * steps]


def test_an_ngram_evals_no_draft_share_counts_the_passes_that_found_nothing(target, conversations):
    """One row at a time: every prompt's first verify pass drafted, each later one found nothing, so
    the share (a cost-model input) is (passes - prompts) / passes, counted from none."""
    convs = conversations[:3]
    r = evaluate(target, _DraftsOnFirstPass(), convs, steps=3, batch=1, max_new_tokens=8)
    assert len(r["requests"]["spec"]["tpot_ms"]) == len(convs)  # no prompt ended at its first token
    passes = r["verify_passes"]
    assert passes > len(convs)
    assert r["no_draft_share"] == (passes - len(convs)) / passes
    # the lookup time is charged to the prompts' first passes, 3 draft tokens each
    assert r["draft_seconds"] == r["phase_seconds"]["spec"]["draft"]
    assert r["draft_step_us"] == 1e6 * r["draft_seconds"] / (len(convs) * 3)



def test_a_single_pass_that_found_nothing_is_a_share_of_one(target, conversations):
    """Two new tokens: the prefill's, then one verify pass, with no 4-gram of the short prompt to match."""
    r = evaluate(target, NgramDrafter(NgramConfig(4, 4)), conversations[:1], steps=3, max_new_tokens=2)
    assert r["verify_passes"] == 1 and r["no_draft_share"] == 1.0
    assert r["decode_passes"] == 1 and r["live_rows_per_pass"] == {"spec": 1.0, "baseline": 1.0}

@pytest.mark.parametrize("short", [False, True])
def test_a_lossless_failure_where_one_side_ended_first_names_its_end(target, conversations, monkeypatch,
                                                                     short):
    """One side's output a prefix of the other's: the first difference is where the shorter one ended,
    reported as its "end" (indexing past it died in an IndexError instead)."""
    real, kept = spec_eval.SpecEngine.generate, {}

    def cut(self, prompts, *, speculative=True, **kw):
        g = real(self, prompts, speculative=speculative, **kw)
        kept[speculative] = list(g.tokens[0])
        if speculative == short:
            g.tokens[0] = g.tokens[0][:3]
        return g

    monkeypatch.setattr(spec_eval.SpecEngine, "generate", cut)
    with pytest.raises(LabError) as e:
        evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:1], max_new_tokens=8)
    want, got = ("end", kept[True][3]) if not short else (kept[False][3], "end")
    assert str(e.value) == (f"lossless check failed: prompt 0 (c0) differs at generated token 3: "
                            f"target-only {want}, speculative {got}")


def test_a_sampled_evals_sides_count_their_own_tokens(target, conversations, monkeypatch):
    """Sampled, the two decodes may end apart (an eos drawn on one side only): each side's tokens and
    tok/s are its own decode's (greedy, both sides' counts are equal and cannot tell them apart)."""
    real, measured = spec_eval.SpecEngine.generate, {}

    def cut(self, prompts, *, speculative=True, **kw):
        g = real(self, prompts, speculative=speculative, **kw)
        if speculative:
            g.tokens = [t[:3] for t in g.tokens]
        measured[speculative] = sum(map(len, g.tokens))  # the last decode of each side is the measured one
        return g

    monkeypatch.setattr(spec_eval.SpecEngine, "generate", cut)
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:2], batch=2, max_new_tokens=12,
                 temperature=0.8)
    assert r["lossless_check"] == "skipped: sampling (temperature > 0)"
    assert (r["spec_tokens"], r["baseline_tokens"]) == (measured[True], measured[False])
    assert measured[True] == 6 < measured[False]
    for side in ("spec", "baseline"):
        assert r[f"{side}_tok_s"] == r[f"{side}_tokens"] / r[f"{side}_seconds"]
