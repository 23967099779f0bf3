"""Review (s73, h6) of data/regenerate_server.py against a real local chat server: a failure with
conversations in flight is the first one, raised once those have landed, the log counting them, and
no queued conversation is asked after it, nor after a Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
from data_helpers import write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate_server import ServerConfig, regenerate_via_server
from drafter_lab.errors import LabError

WAIT_S = 60  # a bound on each wait below, so a broken run fails instead of hanging


def test_the_first_failure_is_raised_after_the_conversations_in_flight(scripted_chat, tmp_path, monkeypatch):
    """c0 fails while c1 and c2 are in flight: the log counts those two, c1 still lands in the journal,
    c2's later failure is not the one raised, and c3 (queued) is never asked."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{k}", "conversations": [
        {"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": "old"}]} for k in range(4)])
    convs, _ = read_conversations(source)
    asked, lock = [], threading.Lock()
    in_flight, logged = threading.Semaphore(0), threading.Event()
    logs = []

    def log(text):
        logs.append(text)
        logged.set()

    def answer(req):
        cid = "c" + req["messages"][0]["content"].split()[-1]
        with lock:
            asked.append(cid)
        if cid == "c0":  # fails once c1 and c2 are both asked
            assert in_flight.acquire(timeout=WAIT_S) and in_flight.acquire(timeout=WAIT_S)
            return 404, {"error": "no such model"}
        if cid in ("c1", "c2"):
            in_flight.release()
            assert logged.wait(WAIT_S)
        if cid == "c2":
            return 404, {"error": "gone"}
        return 200, {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                                                                                    "content": f"new {cid}"}}]}

    reply[0] = answer
    monkeypatch.setattr(regenerate_server, "log", log)
    out = tmp_path / "out.jsonl"
    with pytest.raises(LabError) as e:
        regenerate_via_server(convs, source, out, ServerConfig(url=url, model="m", concurrency=3, retries=0),
                              show_progress=False)
    assert str(e.value).startswith(f"{source}: conversation c0, turn 2: ") and "HTTP 404" in str(e.value)
    assert len(logs) == 1 and "journalling the 2 conversations in flight for a resume" in logs[0]
    assert sorted(asked) == ["c0", "c1", "c2"]
    journal = out.with_name("out.jsonl.partial").read_text().splitlines()[1:]
    assert [json.loads(line)["id"] for line in journal] == ["c1"] and not out.exists()


def test_ctrl_c_drops_the_queue(scripted_chat, tmp_path, monkeypatch):
    """Ctrl-C in the main thread (here at the first answer's progress): the slots take no further
    conversation, as they would go on asking the server for a run that is over."""
    url, reply = scripted_chat
    source = write_jsonl(tmp_path / "c.jsonl", [{"id": f"c{k}", "conversations": [
        {"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": "old"}]} for k in range(3)])
    convs, _ = read_conversations(source)
    asked, interrupted = [], threading.Event()

    def answer(req):
        cid = "c" + req["messages"][0]["content"].split()[-1]
        asked.append(cid)
        if cid != "c0":  # in flight until the interrupt has gone through
            assert interrupted.wait(WAIT_S)
        return 200, {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                                                                                    "content": "new"}}]}

    @contextlib.contextmanager
    def progress(name, total, show):
        def advance(n):
            if n:  # the first answer landed
                raise KeyboardInterrupt
        yield advance

    reply[0] = answer
    monkeypatch.setattr(regenerate_server, "maybe_progress", progress)
    with pytest.raises(KeyboardInterrupt):
        regenerate_via_server(convs, source, tmp_path / "out.jsonl", ServerConfig(url=url, model="m", concurrency=1),
                              show_progress=False)
    interrupted.set()
    for t in threading.enumerate():
        if t.name == "drafter-lab-regenerate":
            t.join(WAIT_S)
    assert asked[0] == "c0" and "c2" not in asked  # c1 may have been taken as c0 landed; c2 never
