"""Review (s74, h13) of data/regenerate_server.py's regeneration of one conversation and its main loop,
against a real local chat server: what an answer keeps when the server gives no token ids or finish reason."""

from __future__ import annotations

import json
import re

import pytest
from data_helpers import write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate_server import ServerConfig, _settings, regenerate_via_server
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal


def test_an_answer_without_token_ids_or_finish_reason_keeps_neither(scripted_chat, tmp_path):
    """A server that returns neither (an older one, a gateway): the answer is its text alone, with no
    null `token_ids` (which a token-exact capture would take for ids) and no temperature they were sampled at."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": "c0", "conversations": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "old"}]}])
    convs, _ = read_conversations(source)
    reply[0] = lambda req: (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "new"}}]})
    out = tmp_path / "out.jsonl"
    result = regenerate_via_server(convs, source, out, ServerConfig(url=url, model="m", temperature=0.5, retries=0),
                                   show_progress=False)
    answer = {"role": "assistant", "content": "new"}
    assert result[0].messages[1] == answer
    assert json.loads(out.read_text())["conversations"][1] == answer


@pytest.mark.parametrize("field, value, said", [
    ("concurrency", 0, "concurrency must be >= 1, got 0"),  # no slot: a KeyError at the first conversation's result
    ("timeout_s", 0, "timeout_s must be a positive number of seconds (at most 1e9), got 0"),
])
def test_a_library_callers_settings_are_checked_before_any_request(scripted_chat, tmp_path, field, value, said):
    """regenerate_via_server checks what `data regenerate` checks, for a caller that does not go through it;
    nothing is asked and no journal is begun."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": "c0", "conversations": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "old"}]}])
    convs, _ = read_conversations(source)
    reply[0] = lambda req: pytest.fail("a request went out")
    out = tmp_path / "out.jsonl"
    with pytest.raises(LabError) as e:
        regenerate_via_server(convs, source, out, ServerConfig(url=url, model="m", **{field: value}),
                              show_progress=False)
    assert str(e.value) == said
    assert not out.exists() and not out.with_name("out.jsonl.partial").exists()


def test_a_served_journal_from_before_answer_slots_is_refused(scripted_chat, tmp_path):
    """A journal begun when prompts went unanswered holds a [user, user, answer] row with its first question
    unanswered: resumed, the row would be kept so. It is refused by name, as a local regeneration's is,
    before any request, and left for the user to delete."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "uua", "conversations": [{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"},
                                        {"role": "assistant", "content": "to both"}]},
        {"id": "c1", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}])
    convs, _ = read_conversations(source)
    cfg, out = ServerConfig(url=url, model="m", retries=0), tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    with Journal(partial, _settings(cfg, source)) as journal:  # the settings as that lab recorded them
        journal.append(convs[0].record())
    reply[0] = lambda req: pytest.fail("a request went out")
    with pytest.raises(LabError) as e:
        regenerate_via_server(convs, source, out, cfg, show_progress=False)
    assert str(e.value) == (f"{partial}: begun before the lab recorded that it answers user turns without an answer: "
                            "its answers may be those of other turns than they would fill now; delete it to start over")
    assert partial.exists() and not out.exists()


def test_a_resumed_runs_progress_counts_the_journalled_conversations_once(scripted_chat, tmp_path, capsys):
    """Two of four conversations journalled: the count starts at them and ends at 4/4, never past it."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{k}", "conversations": [
        {"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "old"}]} for k in range(4)])
    convs, _ = read_conversations(source)
    cfg, out = ServerConfig(url=url, model="m", retries=0), tmp_path / "out.jsonl"
    with Journal(out.with_name("out.jsonl.partial"), _settings(cfg, source, convs)) as journal:
        for c in convs[:2]:
            journal.append(c.record())
    reply[0] = lambda req: (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "new"}}]})
    result = regenerate_via_server(convs, source, out, cfg, show_progress=True)
    assert [c.messages[1]["content"] for c in result] == ["old", "old", "new", "new"]
    counts = [int(n) for n in re.findall(r"^regenerate (\d+)/4 ", capsys.readouterr().err, re.MULTILINE)]
    assert counts and counts[-1] == 4 and max(counts) == 4


def test_a_worker_failure_that_is_no_lab_error_is_raised_as_itself(tmp_path, monkeypatch):
    """A bug (not a refusal of bad input) reaches the caller with its own type and traceback, not as a
    one-line LabError naming the file."""
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": "c0", "conversations": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "old"}]}])
    convs, _ = read_conversations(source)

    def request_json(url, body, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    with pytest.raises(RuntimeError, match="^a bug$"):
        regenerate_via_server(convs, source, tmp_path / "out.jsonl",
                              ServerConfig(url="http://127.0.0.1:9", model="m"), show_progress=False)
