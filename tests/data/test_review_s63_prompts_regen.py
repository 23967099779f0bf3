"""`data regenerate` of prompts: a user turn without an answer gets the target's, locally and through a
server (a file of prompts alone, SpecForge's usual input for regenerating, was refused: "no conversation
with an assistant turn")."""

from __future__ import annotations

import json

from data_helpers import run_cli, stdlib_lines, write_jsonl
from test_data_regenerate import greedy_reference
from test_data_regenerate_server import requests, serving

from drafter_lab.data import regenerate_server
from drafter_lab.data.chat import rendered_with
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import regenerated_turns
from drafter_lab.data.regenerate_server import ServerConfig, _settings
from drafter_lab.journal import Journal
from drafter_lab.targets.hf import fingerprint, load_target, load_tokenizer, stop_token_ids

GEN = ("--max-new-tokens", "6", "--seed", "0")


def prompt_rows(n: int, turns: int = 1) -> list[dict]:
    """n rows of `turns` user turns each and no answers, in both dialects, every other with a system turn."""
    lines = stdlib_lines()
    rows = []
    for i in range(n):
        a = (i * 7) % (len(lines) - turns)
        users = [{"role": "user", "content": lines[a + t]} for t in range(turns)]
        system = [{"role": "system", "content": "You explain Python source."}] if i % 2 else []
        if i % 3 == 0:
            names = {"system": "system", "user": "human"}
            rows.append({"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in system + users]})
        else:
            rows.append({"id": f"p{turns}-{i}", "conversations": system + users})
    return rows


def mixed_row() -> dict:
    """Answered and unanswered user turns in one row: u1 a1 u2 u3 a3 u4."""
    lines = stdlib_lines()
    u = [{"role": "user", "content": lines[40 + k]} for k in range(4)]
    a = [{"role": "assistant", "content": lines[50 + k]} for k in range(2)]
    return {"id": "mixed", "conversations": [u[0], a[0], u[1], u[2], a[1], u[3]]}


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def regenerate_locally(model, source, out, *args) -> list[dict]:
    assert run_cli("data", "regenerate", "--conversations", source, "--out", out, "--target", model, *args) == 0
    return read_rows(out)


def assert_answered(target, rows_in: list[dict], rows_out: list[dict], new_tokens: int = 6) -> None:
    """Each output row is its input's turns with an answer after every user turn: the greedy answer to the
    turns before it as regenerated, with its token ids and finish reason."""
    assert len(rows_in) == len(rows_out)
    for row_in, row_out in zip(rows_in, rows_out):
        messages = row_out["conversations"]
        kept = row_in["conversations"]
        users = [j for j, m in enumerate(messages) if m["role"] == "user"]
        assert all(messages[j + 1]["role"] == "assistant" for j in users)  # every user turn answered
        # The user (and system) turns stay, in order; only answers are between them.
        assert [m["content"] for m in messages if m["role"] != "assistant"] == \
            [m.get("content", m.get("value")) for m in kept if m.get("role", m.get("from")) not in ("assistant", "gpt")]
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            assert (m["content"], m["token_ids"]) == greedy_reference(target, messages, i, new_tokens)
            assert m["finish_reason"] == ("length" if len(m["token_ids"]) == new_tokens else "stop")
            assert m["temperature"] == 0.0 and m["target_fingerprint"] == target.fingerprint


def test_a_prompt_file_gets_the_targets_answers(stopping_llama, tmp_path):
    target = load_target(stopping_llama)
    rows = prompt_rows(5)
    out = regenerate_locally(stopping_llama, write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out.jsonl",
                             "--batch-size", "2", *GEN)
    assert [len(r["conversations"]) for r in out] == [len(r["conversations"]) + 1 for r in rows]
    assert_answered(target, rows, out)
    reasons = {m["finish_reason"] for r in out for m in r["conversations"] if m["role"] == "assistant"}
    assert reasons == {"stop", "length"}  # the stopping target ends some answers itself


def test_multi_turn_prompts_are_answered_turn_by_turn(stopping_llama, tmp_path):
    """[u1, u2] becomes [u1, a1, u2, a2], a2 written after a1 as the target wrote it; a row that answers
    some user turns and not others gets answers after the others, and all its answers are the target's."""
    target = load_target(stopping_llama)
    rows = [*prompt_rows(4, turns=2), mixed_row()]
    out = regenerate_locally(stopping_llama, write_jsonl(tmp_path / "p.jsonl", rows), tmp_path / "out.jsonl",
                             "--batch-size", "3", *GEN)
    assert [[m["role"] for m in r["conversations"]] for r in out][-1] == ["user", "assistant"] * 4
    assert all([m["role"] for m in r["conversations"] if m["role"] != "system"] == ["user", "assistant"] * 2
               for r in out[:-1])
    assert_answered(target, rows, out)
    # The recorded answers count for nothing: answering the prompts alone gives the same conversation.
    bare = {"id": "mixed", "conversations": [m for m in mixed_row()["conversations"] if m["role"] == "user"]}
    alone = regenerate_locally(stopping_llama, write_jsonl(tmp_path / "bare.jsonl", [bare]),
                               tmp_path / "bare-out.jsonl", *GEN)
    assert alone == out[-1:]


def test_a_killed_prompt_regeneration_resumes_as_if_whole(random_llama, tmp_path, interrupt_at):
    """6 rows of 2 prompts each in batches of 2, sampled: 6 batches. Stopped in the 4th (round 2), the
    resumed run generates the 3 batches left and writes the uninterrupted run's bytes."""
    source = write_jsonl(tmp_path / "p.jsonl", prompt_rows(6, turns=2))
    args = ("data", "regenerate", "--conversations", source, "--target", random_llama, "--batch-size", "2",
            "--temperature", "1.0", "--max-new-tokens", "6", "--seed", "3")
    assert run_cli(*args, "--out", tmp_path / "whole.jsonl") == 0
    out, partial = tmp_path / "resumed.jsonl", tmp_path / "resumed.jsonl.partial"
    interrupt_at(4)
    assert run_cli(*args, "--out", out) == 130
    assert not out.exists() and len(partial.read_text().splitlines()) == 1 + 3  # settings + 3 batches
    calls = interrupt_at(None)
    assert run_cli(*args, "--out", out) == 0
    assert len(calls) == 3
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    whole = read_rows(out)
    assert all(len(r["conversations"]) in (4, 5) for r in whole)
    assert all(m["temperature"] == 1.0 and m["token_ids"] for r in whole for m in r["conversations"]
               if m["role"] == "assistant")


def test_prompts_through_a_server_equal_the_local_answers_and_resume(stopping_llama, tmp_path, capsys):
    rows = [*prompt_rows(3), *prompt_rows(2, turns=2), mixed_row()]
    source = write_jsonl(tmp_path / "p.jsonl", rows)
    local = regenerate_locally(stopping_llama, source, tmp_path / "local.jsonl", "--batch-size", "1", *GEN)
    (end,) = stop_token_ids(load_target(stopping_llama))
    for m in (m for r in local for m in r["conversations"] if m["role"] == "assistant"):
        assert m.pop("target_fingerprint") == fingerprint(stopping_llama)  # a server names no weights
        assert m.pop("rendered_with") == rendered_with(load_tokenizer(stopping_llama), None)  # nor its template
        if len(m["token_ids"]) < 6:  # the server's ids end with the end token it stopped at
            m["token_ids"].append(end)
    expected = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in local)
    answers = sum(m["role"] == "assistant" for r in local for m in r["conversations"])
    assert answers == 3 + 2 * 2 + 4
    with serving(stopping_llama, tmp_path) as (url, log):
        assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "served.jsonl",
                       "--server", url, "--concurrency", "2", *GEN) == 0
        assert (tmp_path / "served.jsonl").read_text() == expected
        sent = requests(log)
        assert len(sent) == answers
        served = [Conversation(r["id"], r["conversations"]) for r in local]
        assert {r["seed"] for r in sent} == {regenerate_server.request_seed(0, c.id, i)
                                             for c in served for i in regenerated_turns(c)}
        # Killed after the first 2 conversations: the resume asks only for the rest, and ends the same.
        partial = tmp_path / "resumed.jsonl.partial"
        cfg = ServerConfig(url=url, model=str(stopping_llama), max_new_tokens=6, seed=0)
        # A journal begun before prompts were answered holds its rows unanswered: refused, not resumed.
        with Journal(partial, _settings(cfg, source)) as journal:
            journal.append(read_rows(tmp_path / "served.jsonl")[0])
        assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "resumed.jsonl",
                       "--server", url, *GEN) == 2
        said = capsys.readouterr().err.splitlines()[-1]  # after the local run's progress above
        assert said.startswith(f"error: {partial}: begun before the lab recorded that it answers")
        partial.unlink()
        with Journal(partial, _settings(cfg, source, read_conversations(source, prompts=True)[0])) as journal:
            for row in read_rows(tmp_path / "served.jsonl")[:2]:
                journal.append(row)
        log.unlink()
        assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "resumed.jsonl",
                       "--server", url, *GEN) == 0
        assert (tmp_path / "resumed.jsonl").read_text() == expected
        assert len(requests(log)) == answers - 2


def test_a_file_with_nothing_to_answer_is_refused(random_llama, tmp_path, capsys):
    source = write_jsonl(tmp_path / "s.jsonl", [{"conversations": [{"role": "system", "content": "Be brief."}]}])
    assert run_cli("data", "regenerate", "--conversations", source, "--out", tmp_path / "o.jsonl",
                   "--target", random_llama, *GEN) == 2
    assert capsys.readouterr().err == (f"error: {source}: no conversation with a user or assistant turn "
                                       "(skipped: {'no_user_or_assistant_turn': 1})\n")
    assert not (tmp_path / "o.jsonl").exists()
