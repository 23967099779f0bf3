"""Review (s65) of regenerate.py's pieces: prompts answered as copies, which files count as answering
prompts, rows with nothing to answer, journals from before answer slots or from another device, the
finish reason at the max_new_tokens boundary, and what a regeneration leaves of its caller's objects."""

from __future__ import annotations

import base64
import copy
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.data.conversations import CUT, Conversation
from drafter_lab.data.regenerate import (
    ANSWERS_PROMPTS,
    _set_rng_state,
    answer_slots,
    answerable,
    answers_prompts,
    finish_reason,
    generation_config,
    refuse_unanswering_journal,
    regenerate,
    regeneration_settings,
)
from drafter_lab.errors import LabError


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def said(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_answer_slots_are_copies():
    messages = [{"role": "system", "content": "s"}, user("a"), user("b"), said("old")]
    kept = copy.deepcopy(messages)
    slots = answer_slots(messages)
    assert slots == [messages[0], user("a"), said(""), user("b"), said("old")]
    for m in slots:
        m["content"] = "changed"
    assert messages == kept


def test_a_file_answers_prompts_where_any_row_has_a_user_turn_without_an_answer():
    answered = Conversation(id="a", messages=[user("q"), said("r")])
    prompt = Conversation(id="p", messages=[user("q")])
    assert answers_prompts([answered, prompt]) == answers_prompts([prompt]) == ANSWERS_PROMPTS
    assert answers_prompts([answered]) == answers_prompts([]) == {}


def test_rows_with_nothing_to_answer_are_counted_or_named_under_strict(tmp_path):
    rows = [Conversation(id="s1", messages=[{"role": "system", "content": "s"}]),
            Conversation(id="u", messages=[user("q")]), Conversation(id="s2", messages=[])]
    skipped = {"no_user_or_assistant_turn": 3, "other": 1}
    assert [c.id for c in answerable(rows, skipped, tmp_path / "c.jsonl")] == ["u"]
    assert skipped == {"no_user_or_assistant_turn": 5, "other": 1}
    with pytest.raises(LabError) as e:
        answerable(rows, {}, tmp_path / "c.jsonl", strict=True)
    assert str(e.value) == f"{tmp_path / 'c.jsonl'}: conversation s1 has no user or assistant turn (--strict)"
    assert answerable(rows[1:2], skipped := {}, tmp_path, strict=True) == rows[1:2] and skipped == {}


def test_only_a_journal_begun_before_answer_slots_is_refused(tmp_path):
    journal = tmp_path / "out.jsonl.partial"
    now = {"seed": 0, **ANSWERS_PROMPTS}
    refuse_unanswering_journal(None, now, journal)  # no journal: nothing to refuse
    refuse_unanswering_journal(now, now, journal)
    refuse_unanswering_journal({"seed": 0}, {"seed": 0}, journal)  # answered rows: settings as before
    with pytest.raises(LabError) as e:
        refuse_unanswering_journal({"seed": 0}, now, journal)
    assert str(e.value).startswith(f"{journal}: begun before the lab recorded that it answers user turns")


@pytest.mark.parametrize("ids, reason", [([], "stop"), ([1, 2], "stop"), ([1, 2, 3], CUT), ([1, 2, 3, 4], CUT)])
def test_an_answer_is_cut_when_it_holds_max_new_tokens(ids, reason):
    assert finish_reason(ids, 3) == reason


def _state(*devices: str) -> dict:
    return {d: base64.b64encode(b"\0").decode() for d in devices}


@pytest.mark.parametrize("began, now", [(("cpu",), "cuda"), (("cpu", "cuda"), "cpu")])
def test_a_sampled_journal_from_the_other_device_is_refused(tmp_path, began, now):
    """Checked before any state is set: a CPU machine refuses a GPU's journal (and the reverse) in one line."""
    with pytest.raises(LabError) as e:
        _set_rng_state(_state(*began), torch.device(now), tmp_path / "j")
    assert str(e.value) == (f"{tmp_path / 'j'}: this sampled run began on {'cuda' if 'cuda' in began else 'cpu'}; "
                            "resume it there, or delete the file to start over")


@pytest.fixture(scope="module")
def target(random_llama):
    from drafter_lab.targets.hf import load_target

    return load_target(random_llama)


def test_generation_is_greedy_at_zero_and_samples_the_whole_vocabulary_above(target):
    greedy, sampled = generation_config(target, 0.0, 5), generation_config(target, 0.7, 5)
    assert (greedy.do_sample, greedy.max_new_tokens) == (False, 5)
    assert (sampled.do_sample, sampled.temperature, sampled.top_k, sampled.top_p, sampled.min_p) == (True, 0.7, 0, 1.0, 0.0)
    assert sampled.repetition_penalty == greedy.repetition_penalty == 1.0


def test_a_regeneration_leaves_its_callers_objects_as_they_were(target):
    """The conversations given (their answers rewritten in copies), the tokenizer's padding side (a later
    capture in the same process pads on the right) and the model's own generation config."""
    convs = [Conversation(id="c", messages=[user("What does len do?"), said("old"), user("And max?")])]
    kept = copy.deepcopy(convs)
    tok, model = target.tokenizer, target.model
    side, own = tok.padding_side, model.generation_config
    tok.padding_side = "right"
    try:
        out = regenerate(target, convs, max_new_tokens=2, show_progress=False)
        assert tok.padding_side == "right" and model.generation_config is own
    finally:
        tok.padding_side = side
    assert convs == kept
    assert [m["role"] for m in out[0].messages] == ["user", "assistant", "user", "assistant"]
    assert len(out[0].messages[1]["token_ids"]) == 2 and out[0].messages[3]["temperature"] == 0.0


def test_a_regeneration_resumes_only_with_the_settings_that_make_its_answers(target, tmp_path):
    """The target by what it is (moved, it resumes), the batching (sampling draws in batch order), the
    seed, length and temperature, and a GPU's device type (it rounds otherwise); nothing for the CPU."""
    source = tmp_path / "c.jsonl"
    source.write_text('{"conversations": [{"role": "user", "content": "q"}]}\n')

    def settings(t=target, **kw):
        return regeneration_settings(t, source, **{"temperature": 0.0, "max_new_tokens": 4, "batch_size": 2,
                                                   "seed": 0, **kw})

    def like(**fields):
        return SimpleNamespace(**{"describe": target.describe, "tokenizer": target.tokenizer, "model": target.model,
                                  "device": target.device, **fields})

    base = settings()
    assert "device" not in base
    assert settings(like(describe=lambda: {**target.describe(), "path": "/moved/model"})) == base
    assert settings(like(device=torch.device("cuda", 1))) == {**base, "device": "cuda"}
    for field, value in (("batch_size", 3), ("seed", 1), ("max_new_tokens", 5), ("temperature", 0.5)):
        assert settings(**{field: value}) != base, field


def test_a_template_refusal_in_a_later_round_comes_before_any_generation(target, monkeypatch):
    """Met after round 1's generation, it ended a run whose journal a rerun without that conversation (another
    file) could not resume: every prompt renders first."""
    from test_regenerate_review import ALTERNATE

    from drafter_lab.data import regenerate as regenerate_module

    monkeypatch.setattr(target.tokenizer, "chat_template", ALTERNATE + target.tokenizer.chat_template)
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda *a: pytest.fail("generated before the refusal"))
    twice = Conversation(id="twice", messages=[user("q"), said("a"), said("and another"), user("q2"), said("a2")])
    with pytest.raises(LabError, match="conversation twice, turn 5: chat template rejects"):
        regenerate(target, [twice], max_new_tokens=2, show_progress=False)


@pytest.fixture
def harmony_tokenizer(random_llama):
    from test_data_harmony import SPECIAL

    from drafter_lab.targets.hf import load_tokenizer

    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    return tok


def test_a_harmony_answer_keeps_its_analysis_alone_as_thinking(harmony_tokenizer):
    """A commentary message (a call's preamble) is neither the thinking nor the answer, as GPT-OSS's parsers
    read it; an answer that wrote no channel (a tokenizer that has them, a model that did not use them) is
    its text, not the empty final channel."""
    from drafter_lab.data.regenerate import answer_fields

    tok = harmony_tokenizer
    written = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Aside."
               "<|end|><|start|>assistant<|channel|>final<|message|>Done.")
    ids = tok(written, add_special_tokens=False)["input_ids"]
    assert answer_fields(tok, tok.decode(ids, skip_special_tokens=True), ids) == \
        {"content": "Done.", "reasoning_content": "Think."}
    plain = tok("It is.", add_special_tokens=False)["input_ids"]
    assert answer_fields(tok, "It is.", plain) == {"content": "It is."}


def test_only_answers_cut_at_max_new_tokens_are_reported(target, monkeypatch):
    from drafter_lab.data import regenerate as regenerate_module

    logged = []
    monkeypatch.setattr(regenerate_module, "log", logged.append)
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda t, prompts, g: [("a", [5])] * len(prompts))
    convs = [Conversation(id=f"c{k}", messages=[user("q"), said("old")]) for k in range(2)]
    regenerate(target, convs, max_new_tokens=2, show_progress=True)
    assert logged == []  # every answer stopped: nothing to say
    regenerate(target, convs, max_new_tokens=1, show_progress=True)
    assert len(logged) == 1 and logged[0].startswith("regenerate: 2 of 2 answers reached --max-new-tokens 1 ")
