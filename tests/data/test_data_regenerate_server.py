"""`data regenerate --server`: a real OpenAI-compatible server process gives the same conversations
as regenerating locally, a killed run resumes without asking again, and failures are one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.capture import sampled_at
from drafter_lab.data.chat import rendered_with
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import regenerated_turns
from drafter_lab.data.regenerate_server import ServerConfig, _settings
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.servers import PLAIN
from drafter_lab.targets.hf import fingerprint, load_target, load_tokenizer, stop_token_ids

SERVER = Path(__file__).with_name("chat_server.py")
GEN = ("--max-new-tokens", "6", "--seed", "0")


@contextmanager
def serving(model: Path, tmp_path: Path, *reasoning_field: str):
    """(base URL, file of the requests it got) of a chat server over `model` (with a reasoning parser
    answering in `reasoning_field`, when given)."""
    port_file, log = tmp_path / "port", tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, str(SERVER), str(model), str(port_file), str(log), *reasoning_field])
    try:
        deadline = time.time() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.time() < deadline, "the chat server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}", log
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def server(stopping_llama, tmp_path):
    with serving(stopping_llama, tmp_path) as served:
        yield served


def requests(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def captured_alike(model: Path, tmp_path: Path) -> FeatureSet:
    """`data prepare --token-exact` of tmp_path's local.jsonl and served.jsonl gives the same
    sequences; the served file's features."""
    for name in ("local", "served"):
        assert run_cli("data", "prepare", "--target", model, "--conversations", tmp_path / f"{name}.jsonl",
                       "--out", tmp_path / f"feat-{name}", "--val-fraction", "0", "--token-exact") == 0
    local_feat, served_feat = (FeatureSet(tmp_path / f"feat-{name}") for name in ("local", "served"))
    assert [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in served_feat.sequences("train")] == \
        [(s.input_ids.tolist(), s.loss_mask.tolist()) for s in local_feat.sequences("train")]
    return served_feat


def test_server_regeneration_equals_local_and_resumes(stopping_llama, server, tmp_path):
    url, log = server
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(6))
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", stopping_llama, "--batch-size", "1", *GEN) == 0
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                   "--server", url, "--concurrency", "3", *GEN) == 0
    rows = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    served = (tmp_path / "served.jsonl").read_text()
    (end,) = stop_token_ids(load_target(stopping_llama))
    answers = [m for r in rows for m in r["conversations"] if m["role"] == "assistant"]
    assert any(len(m["token_ids"]) < 6 for m in answers)  # some stopped at the end token
    for m in answers:
        assert m["temperature"] == 0.0
        assert m.pop("target_fingerprint") == fingerprint(stopping_llama)  # a server names no weights
        assert m.pop("rendered_with") == rendered_with(load_tokenizer(stopping_llama), None)  # nor its template
        if len(m["token_ids"]) < 6:  # the server's ids end with the end token it stopped at
            m["token_ids"].append(end)
    # Same answers and ids, same order, same bytes.
    assert served == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert not (tmp_path / "served.jsonl.partial").exists()
    sent = requests(log)
    assert len(sent) == 12 and all(r["max_tokens"] == 6 and r["temperature"] == 0.0 and r["return_token_ids"]
                                   and r["model"] == str(stopping_llama) for r in sent)  # as /v1/models names it
    # Turn 2 is asked with turn 1 as regenerated, not as written, and as text only.
    regenerated = [Conversation(r["id"], r["conversations"]) for r in rows]
    seeds = {regenerate_server.request_seed(0, c.id, i) for c in regenerated for i in regenerated_turns(c)}
    assert {r["seed"] for r in sent} == seeds and len(seeds) == 12  # a random stream per conversation turn
    second = [r["messages"] for r in sent if sum(m["role"] == "assistant" for m in r["messages"]) == 1]
    for messages in second:
        (conv,) = [c for c in regenerated if [m["content"] for m in c.messages[: len(messages) - 1]] ==
                   [m["content"] for m in messages[:-1]]]
        assert messages[-1]["content"] == conv.messages[len(messages) - 1]["content"]
        assert all(set(m) == {"role", "content"} for m in messages)

    # Either file, captured token for token, gives the same sequences: the end token a server
    # returns is not written twice.
    assert sampled_at(captured_alike(stopping_llama, tmp_path).manifest.source) == 0.0

    # A run killed after 2 conversations, mid-way through writing a third line.
    done = [json.loads(line) for line in served.splitlines()][:2]
    partial = tmp_path / "resumed.jsonl.partial"
    cfg = ServerConfig(url=url, model=str(stopping_llama), max_new_tokens=6, seed=0)  # the name it serves
    with Journal(partial, _settings(cfg, convs)) as journal:
        for row in done:
            journal.append(row)
    with open(partial, "a") as f:
        f.write('{"id": "chat-4", "conv')
    log.unlink()
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "resumed.jsonl",
                   "--server", url, *GEN) == 0
    assert (tmp_path / "resumed.jsonl").read_text() == served
    assert len(requests(log)) == 8  # the 4 conversations left, 2 turns each

    # Conversations carrying an earlier regeneration's ids: the server is sent text only, and the
    # answers it replaces get its own ids.
    log.unlink()
    assert run_cli("data", "regenerate", "--conversations", tmp_path / "local.jsonl", "--out", tmp_path / "again.jsonl",
                   "--server", url, *GEN) == 0
    assert (tmp_path / "again.jsonl").read_text() == served
    assert len(requests(log)) == 12 and all(set(m) == {"role", "content"} for r in requests(log) for m in r["messages"])


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])  # SGLang's name, vLLM's
def test_a_reasoning_parsers_answers_capture_as_the_local_ones(stopping_llama, tmp_path, field, capsys):
    """Behind a reasoning parser the server returns the thinking apart, and null content when the
    thinking ran past max_tokens: the answers keep it as reasoning_content, and captured token for
    token they give the local regeneration's sequences."""
    convs = write_jsonl(tmp_path / "c.jsonl", [dict(r, conversations=r["conversations"][:2])
                                               for r in make_conversations(6)])
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", stopping_llama, "--batch-size", "1", *GEN) == 0
    with serving(stopping_llama, tmp_path, field) as (url, _):
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                       "--server", url, *GEN) == 0
    local, served = ([m for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()
                      for m in json.loads(line)["conversations"] if m["role"] == "assistant"]
                     for name in ("local", "served"))
    for mine, theirs in zip(local, served, strict=True):  # the random model never closes a thinking
        assert theirs["content"] == "" and theirs["reasoning_content"] == mine["content"] != ""
        assert theirs["token_ids"][:len(mine["token_ids"])] == mine["token_ids"]
    capsys.readouterr()
    captured_alike(stopping_llama, tmp_path)
    assert "leaves out the reasoning" not in capsys.readouterr().err  # the ids hold it
    # As text, through a template that shows no reasoning, the answers are empty: said, once.
    assert run_cli("data", "prepare", "--target", stopping_llama, "--conversations", tmp_path / "served.jsonl",
                   "--out", tmp_path / "feat-text", "--val-fraction", "0") == 0
    assert f"the chat template leaves out the reasoning of {len(served)} of {len(served)} assistant turns" in \
        " ".join(capsys.readouterr().err.split())


def test_the_models_generation_config_reshapes_no_served_answer(random_llama, tmp_path):
    """The server takes each knob a request leaves unset from generation_config.json, as vLLM and
    SGLang do; every request sets them plain, so greedy answers stay the local plain argmax and sampling
    at T = 1 draws beyond the top-1."""
    model = tmp_path / "opinionated"
    shutil.copytree(random_llama, model)
    (model / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.05, "top_k": 1, "top_p": 0.05, "min_p": 0.9, "repetition_penalty": 50.0,
        "eos_token_id": 2}))
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    gen = ("--max-new-tokens", "12", "--seed", "3")
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", model, "--batch-size", "1", *gen) == 0
    local = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    answers = [m for r in local for m in r["conversations"] if m["role"] == "assistant"]
    assert sum(len(m["token_ids"]) - len(set(m["token_ids"])) for m in answers) > 0  # a penalty would show
    with serving(model, tmp_path) as (url, log):
        for temperature in ("0", "1"):
            assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / f"served-{temperature}.jsonl",
                           "--server", url, "--temperature", temperature, *gen) == 0
    sent = requests(log)
    assert len(sent) == 12 and all(r.items() >= PLAIN.items() for r in sent)

    def texts(path):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [m["content"] for r in rows for m in r["conversations"] if m["role"] == "assistant"]

    assert texts(tmp_path / "served-0.jsonl") == [m["content"] for m in answers]
    sampled, greedy = texts(tmp_path / "served-1.jsonl"), texts(tmp_path / "served-0.jsonl")
    assert sum(a != b for a, b in zip(sampled, greedy)) >= len(greedy) - 1


def test_server_failures_are_one_line(stopping_llama, server, tmp_path, capsys):
    url, _ = server
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    out = tmp_path / "out.jsonl"
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", closed,
                   "--retries", "0", *GEN) == 2
    err = capsys.readouterr().err
    assert f"{closed}/v1/models: cannot reach the server" in err and not out.exists()
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", url + "/nope",
                   "--retries", "0", *GEN) == 2
    assert "server answered HTTP 404" in capsys.readouterr().err
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", url, "--model", "nope",
                   "--retries", "0", *GEN) == 2  # a name it does not serve
    assert f"{url}/v1/chat/completions: server answered HTTP 404" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl.partial").exists()  # nothing was done: nothing to resume
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", url, *GEN) == 0
    partial = tmp_path / "out.jsonl.partial"  # left by a run with other settings (more tokens)
    partial.write_text(json.dumps({"settings": _settings(ServerConfig(url=url), convs)}) + "\n")
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", url, *GEN) == 2
    assert f"{partial}: partial run made with other settings" in capsys.readouterr().err
    # A journal of the sampler before 2026-12-01 (the model's knobs left to the server) is other data.
    now = ServerConfig(url=url, model=str(stopping_llama), max_new_tokens=6, seed=0)
    before = {k: v for k, v in _settings(now, convs).items() if k != "sampler"}
    partial.write_text(json.dumps({"settings": before}) + "\n")
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", out, "--server", url, *GEN) == 2
    assert f"{partial}: partial run made with other settings" in capsys.readouterr().err


def test_a_failure_keeps_the_answers_in_flight_for_a_resume(tmp_path, monkeypatch):
    """One conversation fails while others are in flight: those still land in the journal, the queue
    is dropped, the failure is raised, and a resume asks only for what is missing."""
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(6)))
    failing, started = convs[0].id, threading.Event()
    asked = []

    def answer(cfg, conv):
        asked.append(conv.id)
        if conv.id == failing:
            started.wait(10)  # the others are in flight before it fails
            raise LabError("server answered HTTP 400: bad request", "url")
        started.set()
        time.sleep(0.2)
        return dataclasses.replace(conv, messages=[*conv.messages[:-1], {"role": "assistant", "content": "ok"}])

    monkeypatch.setattr(regenerate_server, "_regenerate_one", answer)
    cfg, out = ServerConfig(url="url", model="m", concurrency=3), tmp_path / "out.jsonl"
    with pytest.raises(LabError, match="HTTP 400"):
        regenerate_server.regenerate_via_server(convs, tmp_path / "c.jsonl", out, cfg, show_progress=False)
    kept = {json.loads(line).get("id") for line in out.with_name("out.jsonl.partial").read_text().splitlines()[1:]}
    assert kept == set(asked) - {failing} and len(asked) < len(convs)  # those in flight kept, the queue dropped
    asked.clear()
    monkeypatch.setattr(regenerate_server, "_regenerate_one", lambda cfg, conv: asked.append(conv.id) or conv)
    result = regenerate_server.regenerate_via_server(convs, tmp_path / "c.jsonl", out, cfg, show_progress=False)
    assert sorted(asked) == sorted({c.id for c in convs} - kept) and [c.id for c in result] == [c.id for c in convs]
