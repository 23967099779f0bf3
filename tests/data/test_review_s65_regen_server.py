"""Review (s65) of `data regenerate --server`'s request and answer handling, pinned without a server: the
URL a base with a trailing slash is asked at, the seeds' range, answers a server may send malformed, the
turns as sent, the refusals that get advice, what a resume must match, and what a finished run leaves."""

from __future__ import annotations

import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate_server import (
    ServerConfig,
    _settings,
    _wire,
    ask,
    check_settings,
    request_seed,
)
from drafter_lab.errors import LabError
from drafter_lab.httpjson import HTTPStatusError
from drafter_lab.journal import Journal

URL = "http://127.0.0.1:9"
ENDPOINT = f"{URL}/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def answering(monkeypatch, message: dict, **choice) -> list[str]:
    """The server answers `message` (with `choice`'s other fields); returns the URLs asked."""
    asked = []

    def request_json(url, body, **kw):
        asked.append(url)
        return {"choices": [{"index": 0, "message": message, **choice}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    return asked


def test_a_base_url_with_a_trailing_slash_is_asked_at_the_same_endpoint(monkeypatch):
    asked = answering(monkeypatch, {"role": "assistant", "content": "ok"})
    for url in (URL, URL + "/"):
        ask(ServerConfig(url=url, model="m"), USER, None, 0)
    assert asked == [ENDPOINT, ENDPOINT]  # not .../9//v1/chat/completions, which servers answer 404


def test_request_seeds_fit_31_bits():
    """Servers take the seed as a signed 32-bit int (vLLM checks it, torch.manual_seed under SGLang)."""
    seeds = [request_seed(s, f"c{k}", t) for s in (0, 1, 2**40) for k in range(50) for t in (1, 3)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert max(seeds) >= 2**30  # the top bit of the 31 is used: no constant shift thrown away
    assert len(set(seeds)) == len(seeds)


@pytest.mark.parametrize("ids", [[5, -1], [5, 1.0], [5, True], "5 6"])
def test_token_ids_that_are_no_token_ids_are_refused(monkeypatch, ids):
    answering(monkeypatch, {"role": "assistant", "content": "ok"}, token_ids=ids)
    with pytest.raises(LabError, match=r"choices\[0\]\.token_ids is not a list of token ids") as e:
        ask(ServerConfig(url=URL, model="m"), USER, None, 0)
    assert e.value.path == ENDPOINT


def test_a_null_answer_is_refused_unless_the_server_parsed_out_thinking_or_calls(monkeypatch):
    """A null content is the thinking's run past max_tokens (a reasoning parser) or an answer of calls
    alone (a tool parser); with neither it is no answer, not the empty one."""
    answering(monkeypatch, {"role": "assistant", "content": None})
    with pytest.raises(LabError, match=r"no text at choices\[0\]\.message\.content") as e:
        ask(ServerConfig(url=URL, model="m"), USER, None, 0)
    assert e.value.path == ENDPOINT
    answering(monkeypatch, {"role": "assistant", "content": None, "reasoning": "hmm"}, finish_reason="length")
    turn, ids = ask(ServerConfig(url=URL, model="m"), USER, None, 0)
    assert (turn, ids) == ({"content": "", "reasoning_content": "hmm", "finish_reason": "length"}, None)


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_answer_the_server_cut_short_is_refused(monkeypatch, reason):
    answering(monkeypatch, {"role": "assistant", "content": "half"}, finish_reason=reason)
    with pytest.raises(LabError, match=f"finish_reason '{reason}'"):
        ask(ServerConfig(url=URL, model="m"), USER, None, 0)


def test_turns_are_sent_as_the_openai_api_writes_them():
    """Arguments as a JSON string, the thinking of a calling turn (interleaved thinking) but of no other,
    the results' ids, and none of the lab's own fields (token ids, finish reason, ...)."""
    call = {"id": "c1", "type": "function", "function": {"name": "size", "arguments": {"path": "a b"}}}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "look it up", "tool_calls": [call],
         "token_ids": [1, 2], "finish_reason": "tool_calls"},
        {"role": "tool", "content": "2048", "tool_call_id": "c1", "name": "size"},
        {"role": "assistant", "content": "2 KiB", "reasoning_content": "easy", "token_ids": [3], "temperature": 0.0,
         "finish_reason": "stop"},
    ]
    sent = _wire(messages)
    assert sent == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "look it up", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "size", "arguments": '{"path": "a b"}'}}]},
        {"role": "tool", "content": "2048", "tool_call_id": "c1", "name": "size"},
        {"role": "assistant", "content": "2 KiB"},
    ]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"path": "a b"}  # the conversation's own stays


@pytest.mark.parametrize("status, advised", [(400, True), (413, True), (422, True), (404, False), (500, False)])
def test_a_refusal_of_the_request_says_what_to_do(monkeypatch, status, advised):
    """vLLM answers a prompt past the context 400, SGLang 400, a gateway 413 (payload too large) and
    FastAPI's validation 422: each is that conversation's, and worth the advice; a 404 or 5xx is the server's."""
    def request_json(url, body, **kw):
        raise HTTPStatusError(status, "no", url)

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    conv = Conversation(id="c7", messages=[*USER, {"role": "assistant", "content": "old"}])
    with pytest.raises(LabError) as e:
        regenerate_server._regenerate_one(ServerConfig(url=URL, model="m"), conv)
    said = str(e.value)
    assert said.startswith("conversation c7, turn 2") and f"HTTP {status}" in said
    assert ("was refused (shorten or leave out that conversation" in said) == advised


def test_the_settings_a_resume_must_match(tmp_path):
    """Where and how the requests go (url, concurrency, timeout, retries) change no answer: a resume with
    other ones continues. No template variables are recorded as none, as before they were recorded."""
    source = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    base = _settings(ServerConfig(url=URL, model="m"), source)
    assert _settings(ServerConfig(url="http://other:1", model="m", concurrency=1, timeout_s=5.0, retries=0),
                     source) == base
    assert _settings(ServerConfig(url=URL, model="m", chat_template_kwargs={}), source) == base
    assert "chat_template_kwargs" not in base
    kwargs = _settings(ServerConfig(url=URL, model="m", chat_template_kwargs={"enable_thinking": False}), source)
    assert kwargs == {**base, "chat_template_kwargs": {"enable_thinking": False}}
    for field, value in (("model", "n"), ("temperature", 0.5), ("max_new_tokens", 7), ("seed", 1)):
        assert _settings(ServerConfig(url=URL, **{"model": "m", field: value}), source) != base, field


@pytest.mark.parametrize("field, value, said", [
    ("concurrency", 0, "concurrency must be >= 1, got 0"),
    ("max_new_tokens", 0, "max_new_tokens must be >= 1, got 0"),
    ("retries", -1, "retries must be >= 0, got -1"),
    ("temperature", -0.5, "temperature must be a finite number >= 0, got -0.5"),
    ("temperature", float("inf"), "temperature must be a finite number >= 0, got inf"),
    ("temperature", float("nan"), "temperature must be a finite number >= 0, got nan"),
])
def test_settings_that_would_never_finish_are_refused(field, value, said):
    with pytest.raises(LabError) as e:
        check_settings(ServerConfig(url=URL, **{field: value}))
    assert str(e.value) == said
    check_settings(ServerConfig(url=URL, concurrency=1, max_new_tokens=1, retries=0, temperature=0.0))


def served(monkeypatch, cut: set[str] = frozenset()) -> list[str]:
    """A server answering every request, at max_tokens for the conversations in `cut`; returns the ids
    of the conversations asked, once per request."""
    asked = []

    def request_json(url, body, **kw):
        cid = "c" + body["messages"][1]["content"].split()[-1]  # "question k" is conversation ck's
        asked.append(cid)
        reason = "length" if cid in cut else "stop"
        return {"choices": [{"index": 0, "finish_reason": reason, "token_ids": [7, 2],
                             "message": {"role": "assistant", "content": "x"}}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    return asked


def test_a_finished_run_removes_its_journal_and_a_resume_asks_only_the_rest(tmp_path, monkeypatch, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{k}", "conversations": [
        {"role": "system", "content": "s"}, {"role": "user", "content": f"question {k}"},
        {"role": "assistant", "content": "old"}]} for k in range(4)])
    convs, _ = read_conversations(source)
    cfg, out = ServerConfig(url=URL, model="m", concurrency=2), tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    # A run killed after c1 and c3 landed: the journal holds them.
    asked = served(monkeypatch)
    regenerate_server.regenerate_via_server([convs[1], convs[3]], source, tmp_path / "first.jsonl", cfg,
                                            show_progress=False)
    with Journal(partial, _settings(cfg, source, convs)) as journal:
        for row in (json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()):
            journal.append(row)
    asked.clear()
    result = regenerate_server.regenerate_via_server(convs, source, out, cfg, show_progress=True)
    assert sorted(asked) == ["c0", "c2"]
    assert [c.id for c in result] == ["c0", "c1", "c2", "c3"] and out.exists() and not partial.exists()
    assert "reached --max-new-tokens" not in capsys.readouterr().err  # no answer was cut: nothing said
    # The ids the server sampled, at the temperature they were sampled at (what a token-exact capture checks)
    assert [c.messages[-1] for c in result] == [{"role": "assistant", "content": "x", "token_ids": [7, 2],
                                                 "temperature": 0.0, "finish_reason": "stop"}] * 4
    out.unlink()
    served(monkeypatch, cut={"c2"})
    regenerate_server.regenerate_via_server(convs, source, out, cfg, show_progress=True)
    said = capsys.readouterr().err
    assert "regenerate: 1 of 4 answers reached --max-new-tokens 128 before the target stopped" in said


@pytest.mark.parametrize("flag, value, said", [
    ("--concurrency", "0", "--concurrency must be >= 1, got 0"),  # no slot: a KeyError for the first conversation
    ("--max-new-tokens", "0", "--max-new-tokens must be >= 1, got 0"),
    ("--temperature", "-1", "--temperature must be a finite number >= 0, got -1.0"),
])
def test_server_settings_are_refused_naming_their_flags(tmp_path, monkeypatch, capsys, flag, value, said):
    monkeypatch.setattr(regenerate_server, "request_json", lambda *a, **kw: pytest.fail("a request went out"))
    source = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "o.jsonl", "--server", URL,
                   "--model", "m", flag, value) == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"
    assert not (tmp_path / "o.jsonl").exists()
