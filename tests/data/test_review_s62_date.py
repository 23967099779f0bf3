"""Chat templates that read the clock (`strftime_now`: Llama 3.2's and 3.3's "Today Date", Mistral Small
3.1's `today`) render the day a run picked once and recorded (`template_date` among its chat template
variables), so a resume, or a capture of a regeneration, on another day renders the same text."""

from __future__ import annotations

import json

import pytest
from data_helpers import clock_at, make_conversations, run_cli, write_jsonl
from transformers.utils import chat_template_utils

from drafter_lab.data.capture import CaptureConfig, prepare_features
from drafter_lab.data.capture_config import TEMPLATE_DATE, template_kwargs_arg
from drafter_lab.data.chat import encode_conversation, pinned, render, rendered_with
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

# Llama 3.2's own lines: a `date_string` variable wins, else the clock.
LLAMA_DATE = ('{%- if not date_string is defined %}{%- if strftime_now is defined %}'
              '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}'
              '{%- endif %}{%- endif %}'
              '{{- "<|im_start|>system\\nToday Date: " + date_string + "<|im_end|>\\n" }}')
# Mistral Small 3.1's: the clock, whatever the variables.
MISTRAL_DATE = '{%- set today = strftime_now("%Y-%m-%d") %}{{- "Today is " + today + ".\\n" }}'
CHAT = [{"role": "user", "content": "What day is it?"}, {"role": "assistant", "content": "A good one."}]
DAY1, DAY2 = "2026-12-04", "2026-12-05"


def dated_tokenizer(random_llama, head: str = LLAMA_DATE):
    tok = load_tokenizer(random_llama)
    tok.chat_template = head + tok.chat_template
    return tok


@pytest.fixture(scope="module")
def clock_llama(random_llama, tmp_path_factory):
    """The random Llama saved with a template that writes the clock's day in a system header."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("clock") / "model"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(out)
    dated_tokenizer(random_llama).save_pretrained(out)
    return out


@pytest.mark.parametrize("head, shown", [(LLAMA_DATE, "Today Date: 04 Dec 2026"), (MISTRAL_DATE, "Today is 2026-12-04.")])
def test_a_day_picked_once_renders_alike_on_another(random_llama, monkeypatch, head, shown):
    tok = dated_tokenizer(random_llama, head)
    clock_at(monkeypatch, DAY1)
    kwargs = pinned(tok, None)
    assert kwargs == {TEMPLATE_DATE: DAY1}
    first = encode_conversation(tok, CHAT, 10_000, template_kwargs=kwargs)
    unpinned = render(tok, CHAT)
    recorded = rendered_with(tok, kwargs)
    assert recorded["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}
    clock_at(monkeypatch, DAY2)
    # Unpinned, the next day is other text and other ids; pinned, a run that reads the record is the same.
    assert render(tok, CHAT) != unpinned
    assert encode_conversation(tok, CHAT, 10_000)[0].tolist() != first[0].tolist()
    again = pinned(tok, None, [None, recorded])
    assert again == kwargs and rendered_with(tok, again) == recorded
    ids, mask = encode_conversation(tok, CHAT, 10_000, template_kwargs=again)
    assert ids.tolist() == first[0].tolist() and mask.tolist() == first[1].tolist()
    assert shown in tok.decode(ids) and render(tok, CHAT, template_kwargs=again) == unpinned
    # With nothing recorded (or a record of another template), a run begun today picks today.
    assert pinned(tok, None, [{**recorded, "chat_template_sha256": "other"}]) == {TEMPLATE_DATE: DAY2}
    assert chat_template_utils.datetime.now().date().isoformat() == DAY2  # the clock is given back


def test_a_named_day_wins_and_the_template_never_sees_it(random_llama, monkeypatch):
    tok = dated_tokenizer(random_llama)
    clock_at(monkeypatch, DAY2)
    kwargs = pinned(tok, {"enable_thinking": False, TEMPLATE_DATE: "2024-02-29"}, [rendered_with(tok, {TEMPLATE_DATE: DAY1})])
    assert kwargs == {"enable_thinking": False, TEMPLATE_DATE: "2024-02-29"}
    assert "Today Date: 29 Feb 2024" in render(tok, CHAT, template_kwargs=kwargs)
    seen = "{{ template_date is defined }}" + tok.chat_template
    tok.chat_template = seen
    assert render(tok, CHAT, template_kwargs=kwargs).startswith("False")
    # Llama's own variable still writes the header as given.
    assert "Today Date: 1 Jan 2025" in render(tok, CHAT, template_kwargs={"date_string": "1 Jan 2025", **kwargs})


def test_templates_without_a_clock_keep_their_settings(random_llama):
    tok = load_tokenizer(random_llama)
    assert pinned(tok, None) is None and pinned(tok, {"a": 1}) == {"a": 1}
    assert "chat_template_kwargs" not in rendered_with(tok, pinned(tok, None))


@pytest.mark.parametrize("day", ["2026-13-01", "20261205", "2026-W49-6", "5 Dec 2026", 20261205])
def test_a_bad_day_is_one_line(random_llama, day, capsys):
    with pytest.raises(LabError, match=f"template_date must be a day written YYYY-MM-DD, got {day!r}"):
        render(dated_tokenizer(random_llama), CHAT, template_kwargs={TEMPLATE_DATE: day})
    text = json.dumps({TEMPLATE_DATE: day})
    with pytest.raises(SystemExit) as e:
        run_cli("data", "prepare", "--target", "t", "--conversations", "c", "--out", "o", "--chat-template-kwargs", text)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "template_date must be a day written YYYY-MM-DD" in err
    assert template_kwargs_arg(json.dumps({TEMPLATE_DATE: "2026-12-05"})) == {TEMPLATE_DATE: "2026-12-05"}


def test_a_capture_resumed_on_another_day_renders_the_day_it_began(clock_llama, tmp_path, monkeypatch):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    cfg = CaptureConfig(max_length=256, shard_size=2, batch_size=2, val_fraction=0.0)
    clock_at(monkeypatch, DAY1)
    out = tmp_path / "feat"
    first = prepare_features(clock_llama, convs, out, cfg)
    assert first.source["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}
    tok = load_tokenizer(clock_llama)
    before = {s.seq_id: s.input_ids.tolist() for s in FeatureSet(out).sequences("train")}
    assert all("Today Date: 04 Dec 2026" in tok.decode(ids) for ids in before.values())
    # Killed after its first shard: the next day's run goes on with the same text, not another.
    (out / first.shards["train"][1]["file"]).unlink()
    manifest = FeatureSet(out).manifest
    manifest.shards["train"] = manifest.shards["train"][:1]
    manifest.save(out)
    clock_at(monkeypatch, DAY2)
    again = prepare_features(clock_llama, convs, out, cfg)
    assert again.source == first.source
    assert {s.seq_id: s.input_ids.tolist() for s in FeatureSet(out).sequences("train")} == before
    # A capture begun that day writes its own day.
    other = prepare_features(clock_llama, convs, tmp_path / "other", cfg)
    assert other.source["chat_template_kwargs"] == {TEMPLATE_DATE: DAY2}
    assert all("Today Date: 05 Dec 2026" in tok.decode(s.input_ids) for s in FeatureSet(tmp_path / "other").sequences("train"))


def test_a_regeneration_is_captured_token_exact_on_another_day(clock_llama, tmp_path, monkeypatch):
    """The answers' prompts were rendered on the day the regeneration ran: a token-exact capture the next
    day renders that day too, rather than refusing them as sampled after other prompts."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    regen = tmp_path / "regen.jsonl"
    clock_at(monkeypatch, DAY1)
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", regen, "--target", clock_llama,
                   "--max-new-tokens", "4", "--seed", "0") == 0
    answers = [m for c in read_conversations(regen)[0] for m in c.messages if "token_ids" in m]
    assert answers and all(m["rendered_with"]["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1} for m in answers)
    clock_at(monkeypatch, DAY2)
    out = tmp_path / "feat"
    assert run_cli("data", "prepare", "--target", clock_llama, "--conversations", regen, "--out", out,
                   "--token-exact", "--val-fraction", "0") == 0
    assert FeatureSet(out).manifest.source["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}


def test_an_online_run_resumed_on_another_day_renders_the_day_it_began(clock_llama, tmp_path, monkeypatch):
    from drafter_lab.train.config import TrainConfig
    from drafter_lab.train.loop import train

    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(8))
    cfg = TrainConfig(draft_vocab_size=128, max_steps=2, batch_size=4, ttt_steps=2, log_every=1, eval_every=2,
                      eval_batch_size=4, threads=1, max_length=96)
    online, out = CaptureConfig(max_length=96, val_fraction=0.25), tmp_path / "run"
    clock_at(monkeypatch, DAY1)
    train(cfg, clock_llama, convs, out, online=online)
    began = json.loads((out / "run.json").read_text())["features"]
    assert began["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}
    clock_at(monkeypatch, DAY2)  # the same text the next day: no "--resume with other training data"
    train(cfg, clock_llama, convs, out, online=online, resume=True)
    assert json.loads((out / "run.json").read_text())["features"] == began


def test_an_eval_pins_the_day_a_sweep_it_resumes_began(random_llama, tmp_path, monkeypatch):
    import argparse

    from drafter_lab.journal import Journal
    from drafter_lab.spec.commands import _pin_template_date

    tok = dated_tokenizer(random_llama)
    clock_at(monkeypatch, DAY2)
    fresh = argparse.Namespace(json=None, chat_template_kwargs=None)
    _pin_template_date(fresh, tok)
    assert fresh.chat_template_kwargs == {TEMPLATE_DATE: DAY2}
    with Journal(tmp_path / "sweep.json.partial", rendered_with(tok, {TEMPLATE_DATE: DAY1})) as journal:
        journal.append({"row": 1})
    resumed = argparse.Namespace(json=str(tmp_path / "sweep.json"), chat_template_kwargs=None)
    _pin_template_date(resumed, tok)
    assert resumed.chat_template_kwargs == {TEMPLATE_DATE: DAY1}


def test_work_begun_before_the_lab_pinned_the_day_resumes_as_it_was_made(clock_llama, tmp_path, monkeypatch):
    """A manifest (journal, run) that records the template but no day was rendered by the clock: it
    resumes unpinned, as it was made, rather than being refused for the day it never recorded."""
    from drafter_lab.data import capture

    tok = load_tokenizer(clock_llama)
    old = rendered_with(tok, {"enable_thinking": False})
    assert pinned(tok, {"enable_thinking": False}, [old]) == {"enable_thinking": False}
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    cfg = CaptureConfig(max_length=256, shard_size=2, batch_size=2, val_fraction=0.0)
    clock_at(monkeypatch, DAY1)
    out = tmp_path / "feat"
    with monkeypatch.context() as m:
        m.setattr(capture, "pinned", lambda tok, kwargs, recorded: kwargs)  # the lab before it pinned the day
        first = prepare_features(clock_llama, convs, out, cfg)
    assert "chat_template_kwargs" not in first.source
    again = prepare_features(clock_llama, convs, out, cfg)
    assert again.source == first.source


def test_renders_in_threads_each_see_their_own_day(random_llama):
    from concurrent.futures import ThreadPoolExecutor

    tok = dated_tokenizer(random_llama, MISTRAL_DATE)
    days = ["2024-02-29", "2026-12-04"] * 20
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda d: render(tok, CHAT, template_kwargs={TEMPLATE_DATE: d}), days))
    assert [t.split("\n")[0] for t in texts] == [f"Today is {d}." for d in days]


def test_a_regeneration_cached_before_the_first_shard_is_reused_on_another_day(clock_llama, tmp_path, monkeypatch,
                                                                                capsys):
    from drafter_lab.data import capture

    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    cfg = CaptureConfig(max_length=256, val_fraction=0.0, regenerate=True, max_new_tokens=4)
    out = tmp_path / "feat"
    clock_at(monkeypatch, DAY1)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(capture, "capture_states", killed)
        prepare_features(clock_llama, convs, out, cfg)
    (cache,) = out.glob("regenerated-*.jsonl")
    clock_at(monkeypatch, DAY2)
    capsys.readouterr()
    manifest = prepare_features(clock_llama, convs, out, cfg)
    assert f"regenerate: reusing {cache}" in " ".join(capsys.readouterr().err.split())
    assert manifest.source["chat_template_kwargs"] == {TEMPLATE_DATE: DAY1}
