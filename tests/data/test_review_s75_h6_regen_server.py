"""Review (s75, h6) of data/regenerate_server.py's main loop: answers cut at --max-new-tokens are said
without the progress display too, and a wait on workers that are all gone without their last report ends."""

from __future__ import annotations

import threading
import types

from data_helpers import write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate_server import ServerConfig, regenerate_via_server
from drafter_lab.errors import LabError


def _convs(tmp_path, n):
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{k}", "conversations": [
        {"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "old"}]} for k in range(n)])
    return read_conversations(source)[0], source


def test_answers_cut_at_max_new_tokens_are_said_without_the_progress_display(scripted_chat, tmp_path, capsys):
    """Only the progress display said it: a caller that turned progress off (a script, a notebook) lost the
    one line telling that the cut answers' end-of-turn token does not train."""
    url, reply = scripted_chat
    convs, source = _convs(tmp_path, 2)

    def answer(req):
        reason = "length" if req["messages"][0]["content"] == "q1" else "stop"
        return 200, {"choices": [{"index": 0, "finish_reason": reason,
                                  "message": {"role": "assistant", "content": "new"}}]}

    reply[0] = answer
    regenerate_via_server(convs, source, tmp_path / "out.jsonl", ServerConfig(url=url, model="m", max_new_tokens=5,
                                                                              retries=0), show_progress=False)
    err = capsys.readouterr().err
    assert "regenerate: 1 of 2 answers reached --max-new-tokens 5 before the target stopped" in err
    assert "regenerate 2/2" not in err  # the progress display itself stays off


class _GoneThread(threading.Thread):
    """A worker that ends at once without its last report, as one killed mid-conversation would."""

    def run(self):
        pass


def test_a_wait_on_workers_all_gone_without_reporting_ends(tmp_path, monkeypatch):
    """finished.get() had no end: with every worker gone, the run hung forever. Now a check that some worker
    lives, between reports, ends it in one line naming the conversations' file."""
    convs, source = _convs(tmp_path, 3)
    monkeypatch.setattr(regenerate_server, "threading",
                        types.SimpleNamespace(Thread=_GoneThread, Event=threading.Event, Lock=threading.Lock))
    monkeypatch.setattr(regenerate_server, "WORKER_CHECK_S", 0.01, raising=False)
    raised = []

    def run():
        try:
            regenerate_via_server(convs, source, tmp_path / "out.jsonl",
                                  ServerConfig(url="http://127.0.0.1:9", model="m", concurrency=2), show_progress=False)
        except BaseException as e:
            raised.append(e)

    waiter = threading.Thread(target=run, daemon=True)  # before the fix it never returned
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "regenerate_via_server still waits on workers that are gone"
    assert len(raised) == 1 and isinstance(raised[0], LabError)
    assert str(raised[0]) == (f"{source}: regenerate: its workers are gone without reporting their end (a bug); "
                              "the conversations journalled so far resume")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_worker_still_answering_is_waited_for_past_the_liveness_check(tmp_path, monkeypatch):
    """The check never ends a wait on a worker that lives: an answer may take many check intervals."""
    convs, source = _convs(tmp_path, 1)
    monkeypatch.setattr(regenerate_server, "WORKER_CHECK_S", 0.01)
    gate = threading.Event()
    calls = []

    def request_json(url, body, **kw):
        calls.append(url)
        gate.wait(0.5)  # some 50 intervals
        return {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    result = regenerate_via_server(convs, source, tmp_path / "out.jsonl",
                                   ServerConfig(url="http://127.0.0.1:9", model="m"), show_progress=False)
    assert len(calls) == 1 and result[0].messages[-1]["content"] == "x"

