"""Review (s77 h9) of regenerate.py, from a second mutation audit: the sampler's neutral knobs, the
documented defaults, the progress line's round, and the fields an earlier answer leaves behind."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.conversations import Conversation
from drafter_lab.data.regenerate import generation_config, regenerate

NEUTRAL = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
               repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0)
SAMPLING_ONLY = ("top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def said(text: str, **fields) -> dict:
    return {"role": "assistant", "content": text, **fields}


@pytest.fixture(scope="module")
def target(random_llama):
    from drafter_lab.targets.hf import load_target

    return load_target(random_llama)


@pytest.fixture
def calls(monkeypatch):
    """generate_texts replaced: each call's prompts, config and the CPU seed it drew under, answered "a"."""
    seen = []

    def generate_texts(target, prompts, gen_config):
        seen.append((list(prompts), gen_config, torch.initial_seed()))
        return [("a", [5])] * len(prompts)

    monkeypatch.setattr(regenerate_module, "generate_texts", generate_texts)
    return seen


def test_sampling_sets_every_knob_to_its_neutral_value(target):
    """Written out here, not read from NEUTRAL_SAMPLING, so that a knob set to shape the distribution fails."""
    sampled = generation_config(target, 0.7, 5)
    assert {k: getattr(sampled, k) for k in NEUTRAL} == NEUTRAL
    assert (sampled.do_sample, sampled.temperature) == (True, 0.7)


def test_greedy_leaves_the_sampling_only_knobs_unset_and_the_temperature_neutral(target):
    """Set on a greedy config, transformers warns that they are ignored; the others still apply."""
    from transformers import GenerationConfig

    greedy, default = generation_config(target, 0.0, 5), GenerationConfig()
    assert {k: getattr(greedy, k) for k in SAMPLING_ONLY} == {k: getattr(default, k) for k in SAMPLING_ONLY}
    assert {k: getattr(greedy, k) for k in NEUTRAL if k not in SAMPLING_ONLY} == \
        {k: v for k, v in NEUTRAL.items() if k not in SAMPLING_ONLY}
    assert (greedy.do_sample, greedy.temperature) == (False, 1.0)


def test_the_defaults_are_greedy_128_tokens_batches_of_16_and_seed_0(target, calls):
    convs = [Conversation(id=f"c{k:02}", messages=[user("q" * (k + 1))]) for k in range(17)]
    out = regenerate(target, convs, show_progress=False)
    assert [len(p) for p, _, _ in calls] == [16, 1]
    assert {(g.max_new_tokens, g.do_sample, seed) for _, g, seed in calls} == {(128, False, 0)}
    assert {c.messages[1]["temperature"] for c in out} == {0.0}


def test_the_progress_line_counts_every_answer_and_names_the_last_round(target, calls, capsys):
    """Off a terminal the bar is a line at the end: three answers over two rounds, batches of one."""
    convs = [Conversation(id="two", messages=[user("q"), said("old"), user("q2")]),
             Conversation(id="one", messages=[user("q")])]
    regenerate(target, convs, max_new_tokens=2, batch_size=1)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("regenerate ")]
    assert lines and lines[-1].startswith("regenerate 3/3 [") and lines[-1].endswith("round=2")


def test_an_earlier_answers_thinking_goes_and_its_finish_reason_comes_last(target, calls):
    """As a server's message: the reason is the last field, and a plain answer carries no old thinking."""
    convs = [Conversation(id="c", messages=[user("q"), said("old", finish_reason="length", reasoning_content="t")])]
    answer = regenerate(target, convs, max_new_tokens=2, show_progress=False)[0].messages[1]
    assert "reasoning_content" not in answer
    assert list(answer)[-1] == "finish_reason" and answer["finish_reason"] == "stop"


def test_a_special_close_tag_mid_answer_keeps_the_thinking_before_it(random_llama):
    """A prompt that opens the thinking (DeepSeek-R1's `<think>\\n`) leaves the answer only its close tag,
    after the thinking's first tokens: all of them stay."""
    from drafter_lab.data.regenerate import answer_fields
    from drafter_lab.targets.hf import load_tokenizer

    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    written = "They ask about join.\n</think>\n\nIt joins path parts."
    ids = tok(written, add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text != written  # the tag is special: a plain decode drops it
    assert answer_fields(tok, text, ids) == {"content": written}
