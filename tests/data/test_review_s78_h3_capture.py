"""tokenize_conversations' notes and counts: each kind of conversation it notes (answers another target
sampled, answers sampled after prompts rendered otherwise, reasoning or tool calls the chat template
leaves out, a conversation the template refuses) is counted on the main rank alone, and a batch with
nothing to note says nothing. And prepare_features: nothing within max_length is one line; a failed run
removes the --out it made but not one it was given; the temperature answers read in were sampled at is
recorded for a token-exact capture of them alone; a rank other than 0 regenerates but caches nothing; a
regeneration begun under its own name is resumed rather than an older-named one; and one killed before
its cache landed resumes its journal on another day, rendering the day it began."""

from __future__ import annotations

import pytest
from data_helpers import clock_at, make_conversations, write_jsonl
from test_data_capture import nan_model
from test_review_s62_date import DAY1, DAY2, dated_tokenizer

from drafter_lab import atomic
from drafter_lab.data.capture import (
    REGENERATION_KEYS,
    TEMPLATE_REFUSES,
    CaptureConfig,
    prepare_features,
    resume_settings,
    sampled_at,
    tokenize_conversations,
)
from drafter_lab.data.capture_config import STOP_IDS, TEMPLATE_DATE, without
from drafter_lab.data.chat import rendered_with
from drafter_lab.data.conversations import Conversation
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target

REFUSING = "{% for m in messages %}{% if m.content == 'refuse me' %}{{ raise_exception('no') }}{% endif %}{% endfor %}"
"""A prefix to the chat template that refuses a conversation with a turn saying 'refuse me'."""
NOTES = ("sequences the chat template refuses", "hold answers target(s)", "rendered otherwise than here",
         "leaves out the reasoning", "leaves out tool calls")


def chat(answer: dict | None = None, question: str = "What does os.path.join do?") -> list[dict]:
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": "It joins path parts.", **(answer or {})}]


def said(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


@pytest.fixture
def target(random_llama):
    """The random Llama (ChatML: it writes no reasoning and no tool calls), refusing 'refuse me'."""
    target = load_target(random_llama)
    target.tokenizer.chat_template = REFUSING + target.tokenizer.chat_template
    return target


def noted(target) -> list[Conversation]:
    """Six conversations, five of them noted once each."""
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    off = rendered_with(target.tokenizer, {"enable_thinking": False})
    return [Conversation("plain", chat()),
            Conversation("foreign", chat({"target_fingerprint": "other-target"})),
            Conversation("reprompted", chat({"rendered_with": off})),
            Conversation("thought", chat({"reasoning_content": "They ask about join."})),
            Conversation("called", [*chat({"content": "", "tool_calls": [call]}),
                                    {"role": "tool", "content": "a.py", "tool_call_id": "c1"},
                                    {"role": "assistant", "content": "There is a.py."}]),
            Conversation("refused", chat(question="refuse me"))]


def test_a_batch_with_nothing_to_note_says_nothing(target, capsys):
    convs = [Conversation(f"c{i}", chat(question=f"What does os.path.{f} do?")) for i, f in enumerate(["join", "split"])]
    skipped: dict = {}
    items = tokenize_conversations(target, convs, CaptureConfig(), "c.jsonl", skipped, main=True)
    assert [it[0] for it in items] == ["c0", "c1"] and skipped == {}
    err = said(capsys)
    assert not [n for n in NOTES if n in err]


def test_each_note_counts_its_conversations_on_the_main_rank(target, capsys):
    convs = noted(target)
    skipped: dict = {}
    items = tokenize_conversations(target, convs, CaptureConfig(), "c.jsonl", skipped, main=True)
    assert [it[0] for it in items] == [c.id for c in convs[:-1]] and skipped == {TEMPLATE_REFUSES: 1}
    err = said(capsys)
    assert "c.jsonl: skipped 1 of 6 sequences the chat template refuses" in err
    assert "(first: conversation refused: chat template rejects the conversation: no)" in err
    assert f"c.jsonl: 1 of 6 conversations hold answers target(s) other-target sampled, not this one " \
           f"({target.fingerprint})" in err
    assert "c.jsonl: 1 of 6 conversations hold answers sampled after prompts rendered otherwise" in err
    assert "leaves out the reasoning of 1 of 1 assistant turns" in err
    assert "leaves out tool calls of 1 of 1 assistant turns" in err


def test_another_rank_counts_alike_and_notes_nothing(target, capsys):
    skipped: dict = {}
    items = tokenize_conversations(target, noted(target), CaptureConfig(), "c.jsonl", skipped, main=False)
    assert len(items) == 5 and skipped == {TEMPLATE_REFUSES: 1}
    err = said(capsys)
    assert not [n for n in NOTES if n in err]


@pytest.mark.parametrize("cid, message", [
    ("foreign", "conversation foreign: answers sampled by target other-target, not by this one"),
    ("reprompted", "conversation reprompted: answers sampled after prompts rendered with"),
])
def test_token_exact_refuses_answers_not_the_targets_own_after_its_own_prompts(target, cid, message):
    (conv,) = [c for c in noted(target) if c.id == cid]
    with pytest.raises(LabError, match=f"c.jsonl: {message}"):
        tokenize_conversations(target, [conv], CaptureConfig(token_exact=True), "c.jsonl", {}, main=False)


def test_no_sequence_within_max_length_is_one_line_naming_the_conversations(random_llama, tmp_path):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    out = tmp_path / "feat"
    with pytest.raises(LabError) as e:
        prepare_features(random_llama, convs, out, max_length=4)
    assert str(e.value) == (f"{convs}: no sequence keeps an assistant token within max_length=4 "
                            "(skipped: {'no_loss_tokens_within_max_length': 2})")
    assert not out.exists()


def test_a_failed_run_removes_the_out_it_made_but_not_an_empty_one_it_was_given(random_llama, tmp_path):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    nan = nan_model(tmp_path, random_llama)
    given = tmp_path / "given"
    given.mkdir()
    for out in (tmp_path / "made", given):
        with pytest.raises(LabError, match="target produced NaN/inf hidden states"):
            prepare_features(nan, convs, out, max_length=128, val_fraction=0)
    assert not (tmp_path / "made").exists() and given.is_dir() and not any(given.iterdir())


@pytest.fixture
def clock_llama(random_llama, tmp_path):
    """The random Llama saved with a template that writes the clock's day (Llama 3.2's lines)."""
    from transformers import LlamaForCausalLM

    out = tmp_path / "clock"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(out)
    dated_tokenizer(random_llama).save_pretrained(out)
    return out


def test_a_regeneration_killed_before_its_cache_resumes_its_journal_on_another_day(clock_llama, tmp_path,
                                                                                  monkeypatch, interrupt_at):
    """The day is found in the journal (no manifest, no cache yet): the rounds it holds are not sampled again."""
    convs = write_jsonl(tmp_path / "c.jsonl", [dict(r, conversations=r["conversations"][:-2])
                                               for r in make_conversations(4)])
    cfg = CaptureConfig(max_length=256, val_fraction=0.0, regenerate=True, max_new_tokens=4, regen_batch_size=1)
    out = tmp_path / "feat"
    clock_at(monkeypatch, DAY1)
    interrupt_at(3)
    with pytest.raises(KeyboardInterrupt):
        prepare_features(clock_llama, convs, out, cfg)
    (journal,) = out.glob("regenerated-*.jsonl.partial")
    clock_at(monkeypatch, DAY2)
    rounds = interrupt_at(None)
    manifest = prepare_features(clock_llama, convs, out, cfg)
    assert manifest.source["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}
    assert len(rounds) == 2 and list(out.glob("regenerated-*")) == [out / journal.name.removesuffix(".partial")]


def test_only_a_token_exact_capture_of_the_answers_read_records_their_temperature(random_llama, tmp_path):
    """Answers sampled at 0.7 (their token_ids and temperature recorded): captured as text, or regenerated at
    1.0, they are not the target's samples at 0.7."""
    tok = load_target(random_llama).tokenizer
    answer = {"role": "assistant", "content": "It joins path parts.", "temperature": 0.7,
              "token_ids": tok("It joins path parts.", add_special_tokens=False)["input_ids"]}
    convs = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{i}", "conversations": [chat()[0], answer]} for i in range(2)])
    args = dict(max_length=128, val_fraction=0.0)
    assert prepare_features(random_llama, convs, tmp_path / "exact", token_exact=True, **args).source["sampled_at"] == 0.7
    assert "sampled_at" not in prepare_features(random_llama, convs, tmp_path / "text", **args).source
    regenerated = prepare_features(random_llama, convs, tmp_path / "regen", token_exact=True, regenerate=True,
                                   temperature=1.0, max_new_tokens=4, **args).source
    assert "sampled_at" not in regenerated and sampled_at(regenerated) == 1.0


def test_a_rank_other_than_0_regenerates_but_caches_nothing(random_llama, tmp_path, monkeypatch):
    """Rank 0 alone writes the regeneration's cache (and its journal): a second writer would race it."""
    import torch

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)  # one rank: nothing to broadcast
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    out = tmp_path / "out"
    manifest = prepare_features(random_llama, convs, out, max_length=128, regenerate=True, max_new_tokens=4)
    assert manifest.source["regenerate"] is not None and not out.exists()


def test_a_regeneration_under_its_own_name_wins_over_one_named_as_an_older_lab_would(random_llama, tmp_path,
                                                                                      interrupt_at):
    """Where `out` holds both, the one named by today's settings is this run's: the older-named one (without
    the stop tokens, as a lab before 2026-12-04 named it) is neither resumed nor lets the settings drop them."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    cfg = CaptureConfig(max_length=128, val_fraction=0.0, regenerate=True, max_new_tokens=4)
    out = tmp_path / "feat"
    first = prepare_features(random_llama, convs, out, cfg)
    settings = resume_settings(first.target, first.aux_layer_ids, first.dtype, first.source)
    (cache,) = out.glob("regenerated-*.jsonl")
    assert cache.name == f"regenerated-{atomic.sha256_json({k: v for k, v in settings.items() if k in REGENERATION_KEYS})[:12]}.jsonl"
    for p in out.iterdir():
        if p != cache:
            p.unlink()
    older = out / f"regenerated-{atomic.sha256_json(without(settings, [STOP_IDS]))[:12]}.jsonl"
    older.write_text(cache.read_text())
    calls = interrupt_at(None)
    again = prepare_features(random_llama, convs, out, cfg)
    assert not calls and again.source == first.source and STOP_IDS in again.source
