"""Review (s67, h3) of capture_config.py, regenerate.py and regenerate_server.py: the gaps a mutation audit
left and what a careful read found."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from test_review_s65_regen_server import URL, answering
from tokenizers import processors

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data import regenerate_server
from drafter_lab.data.capture_config import template_kwargs_arg
from drafter_lab.data.chat import render
from drafter_lab.data.conversations import Conversation
from drafter_lab.data.regenerate import (
    answer_fields,
    answer_slots,
    answerable,
    generate_texts,
    generation_config,
    regenerate,
    regenerated_turns,
    unanswered,
)
from drafter_lab.data.regenerate_server import ServerConfig, ask
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.servers import PLAIN
from drafter_lab.targets.hf import load_target, load_tokenizer, stop_token_ids

ENDPOINT = f"{URL}/v1/chat/completions"


@pytest.fixture
def unk_tokenizer(random_llama):
    """The random Llama's tokenizer with an unknown token, as Llama 2's and Mistral's have: a think tag its
    vocabulary lacks converts to it."""
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"unk_token": "<unk>"})
    return tok


def test_an_unknown_token_in_an_answer_is_left_out_as_other_special_tokens_are(unk_tokenizer):
    """It was kept as a think tag would be: the answer's text held "<unk>", which a capture that does not keep
    the ids then trained as text."""
    tok = unk_tokenizer
    assert tok.convert_tokens_to_ids("<think>") == tok.unk_token_id
    ids = tok("It is.", add_special_tokens=False)["input_ids"]
    ids = [*ids[:1], tok.unk_token_id, *ids[1:]]
    text = tok.decode(ids, skip_special_tokens=True)
    assert "<unk>" not in text
    assert answer_fields(tok, text, ids) == {"content": text}


@pytest.mark.parametrize("parsed, kept", [
    ({"reasoning_content": "hmm"}, {"reasoning_content": "hmm"}),
    ({"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "size", "arguments": '{"path": "a"}'}}]},
     {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "size", "arguments": {"path": "a"}}}]}),
])
def test_a_null_answer_left_out_beside_thinking_or_calls_is_the_empty_answer(monkeypatch, parsed, kept):
    """A server (or a gateway before it) that writes no nulls leaves `content` out where the answer is
    calls alone or thinking cut at max_tokens: that answer was refused as having no text."""
    answering(monkeypatch, {"role": "assistant", **parsed}, finish_reason="length")
    turn, ids = ask(ServerConfig(url=URL, model="m"), [_turn("user", "q")], None, 0)
    assert (turn, ids) == ({"content": "", **kept, "finish_reason": "length"}, None)


def test_template_variables_keep_their_finite_numbers():
    """Only a number past a double's range is refused: a finite one reaches the template as it was written."""
    assert template_kwargs_arg('{"reasoning_budget": 0.5, "scale": -2.5e3, "n": 3}') == \
        {"reasoning_budget": 0.5, "scale": -2500.0, "n": 3}


def _turn(role: str, content: str = "x", **fields) -> dict:
    return {"role": role, "content": content, **fields}


CALL = {"id": "c1", "type": "function", "function": {"name": "size", "arguments": {"path": "a"}}}


def test_turns_making_calls_stay_and_every_other_answer_is_rewritten():
    conv = Conversation(id="c", messages=[_turn("system"), _turn("user"), _turn("assistant", "", tool_calls=[CALL]),
                                          _turn("tool", "2048", tool_call_id="c1"), _turn("assistant"), _turn("user"),
                                          _turn("assistant")])
    assert regenerated_turns(conv) == [4, 6]


@pytest.mark.parametrize("roles, gaps", [
    ([], []),
    (["user"], [0]),  # the last turn: no turn after it
    (["system", "user", "user", "assistant", "user"], [1, 4]),
    (["user", "assistant", "user", "assistant"], []),
    (["user", "system", "assistant"], [0]),  # answered only by the turn right after it
    (["assistant", "tool", "user"], [2]),
])
def test_a_user_turn_is_unanswered_unless_an_assistant_turn_follows_it(roles, gaps):
    messages = [_turn(r) for r in roles]
    assert unanswered(messages) == gaps
    slotted = answer_slots(messages)
    assert len(slotted) == len(messages) + len(gaps) and unanswered(slotted) == []
    assert all(slotted[j + 1 + k] == _turn("assistant", "") for k, j in enumerate(gaps))


def _asked(k: int) -> list[dict]:
    """A recorded answer (its thinking and finish reason those of an earlier regeneration) and a question;
    every third row a question alone, answered in round 1 only."""
    first = [_turn("user", f"What does line {k} of textwrap.py do?"),
             _turn("assistant", "old", reasoning_content="old thinking", finish_reason="length")]
    return [*first, _turn("user", "Why?")] if k % 3 != 2 else first[:1]


def test_a_sampled_run_resumed_after_any_batch_ends_as_one_never_killed(random_llama, tmp_path):
    """Each batch's answers and the RNG state after it are journalled; a rerun replays the batches recorded
    and samples the rest from that state: the same conversations, and the same journal, as a run not killed.
    The seed alone decides the draws, whatever the process drew before."""
    target = load_target(random_llama)
    convs = [Conversation(id=f"c{k}", messages=_asked(k)) for k in range(3)]
    gen = dict(temperature=1.0, max_new_tokens=3, batch_size=2, seed=5, show_progress=False)
    whole = tmp_path / "whole.partial"
    with Journal(whole, {}) as journal:
        expected = regenerate(target, convs, journal=journal, **gen)
    answers = [m for c in expected for m in c.messages if m["role"] == "assistant"]
    assert len(answers) == 5 and not any("reasoning_content" in m for m in answers)  # the old thinking goes
    lines = whole.read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 2 + 1  # the settings, then round 0's 2 batches and round 1's one
    assert all("rng" in r for r in Journal(whole, {}, write=False).records)
    for kept in range(1, 4):
        part = tmp_path / f"{kept}.partial"
        part.write_text("".join(lines[:1 + kept]))
        with Journal(part, {}) as journal:
            assert regenerate(target, convs, journal=journal, **gen) == expected, kept
        assert part.read_text() == whole.read_text()
    torch.manual_seed(1234)
    assert regenerate(target, convs, **gen) == expected
    assert regenerate(target, convs, **{**gen, "seed": 6}) != expected


def test_a_greedy_run_journals_no_rng_state_and_resumes(random_llama, tmp_path, monkeypatch, capsys):
    """Nothing is drawn: the journal holds the answers alone, and a rerun replays them without one, its
    progress counting the replayed answers, round by round."""
    target = load_target(random_llama)
    convs = [Conversation(id="c", messages=_asked(0))]
    with Journal(tmp_path / "j.partial", {}) as journal:
        done = regenerate_module.regenerate(target, convs, max_new_tokens=2, journal=journal, show_progress=False)
    records = Journal(tmp_path / "j.partial", {}, write=False).records
    assert [sorted(r) for r in records] == [["answers", "round", "token_ids"]] * 2
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda *a: pytest.fail("generated a recorded batch"))
    capsys.readouterr()
    with Journal(tmp_path / "j.partial", {}) as journal:
        assert regenerate_module.regenerate(target, convs, max_new_tokens=2, journal=journal) == done
    assert re.match(r"regenerate 2/2 \[\d+ s\] round=2\nregenerate: 2 of 2 answers reached", capsys.readouterr().err)


def test_a_special_token_the_target_writes_is_no_part_of_its_answers_text(random_llama):
    """The ids keep it (a token-exact capture trains what was sampled); the text, as a server detokenizes it,
    leaves it out."""
    target = load_target(random_llama)
    tok, gen = target.tokenizer, generation_config(target, 0.0, 4)
    prompt = render(tok, [_turn("user", "What does textwrap.py do?")], True)
    ((_, ids),) = generate_texts(target, [prompt], gen)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    with torch.no_grad():  # it wins where the answer's first token did
        target.model.lm_head.weight[start] = target.model.lm_head.weight[ids[0]] * 1.05
    ((text, ids),) = generate_texts(target, [prompt], gen)
    assert ids[0] == start and "<|im_start|>" not in text
    assert text == tok.decode(ids[1:], skip_special_tokens=True)


def test_a_request_asks_for_plain_sampling_and_the_ids_it_sampled(monkeypatch):
    """The whole request as sent, and how: no tools or template variables where the run has none."""
    sent = []

    def request_json(url, body, **kw):
        sent.append((url, body, kw))
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    cfg = ServerConfig(url=URL + "/", model="m", temperature=0.7, max_new_tokens=9, timeout_s=5.0,
                       retries=2, chat_template_kwargs={"enable_thinking": False})
    tools = [{"type": "function", "function": {"name": "size", "parameters": {}}}]
    asked = [_turn("user", "q")]
    assert ask(cfg, asked, tools, 77) == ({"content": "ok"}, None)
    ask(replace(cfg, chat_template_kwargs=None), asked, None, 78)
    request = {"model": "m", "messages": asked, "max_tokens": 9, "temperature": 0.7, "seed": 77, **PLAIN,
               "return_token_ids": True}
    how = {"timeout_s": 5.0, "retries": 2}
    assert sent == [
        (ENDPOINT, {**request, "chat_template_kwargs": {"enable_thinking": False}, "tools": tools}, how),
        (ENDPOINT, {**request, "seed": 78}, how),
    ]


def test_a_prompt_goes_to_the_model_as_its_text_alone_padded_on_the_left(random_llama, monkeypatch):
    """Under a tokenizer that adds a BOS (Llama 3's) as under one that does not: the rendered prompt already
    holds what the template writes, and a second BOS would be a prompt no server sends."""
    target = load_target(random_llama)
    tok = target.tokenizer
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<|im_start|> $A",
                                                                  special_tokens=[("<|im_start|>", bos)])
    assert tok("a")["input_ids"][0] == bos
    fed, generate = [], target.model.generate
    monkeypatch.setattr(target.model, "generate", lambda **kw: fed.append(kw) or generate(**kw))
    prompts = [render(tok, [_turn("user", q)], True) for q in ("Why?", "What does the textwrap module do, and how?")]
    gen = generation_config(target, 0.0, 2)
    generate_texts(target, prompts, gen)
    plain = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, plain))
    assert len(plain[0]) < width
    assert fed[0]["input_ids"].tolist() == [[gen.pad_token_id] * (width - len(p)) + p for p in plain]
    assert fed[0]["attention_mask"].tolist() == [[0] * (width - len(p)) + [1] * len(p) for p in plain]


def test_rows_with_nothing_to_answer_are_counted_from_none(tmp_path):
    rows = [Conversation(id="s", messages=[_turn("system")]), Conversation(id="e", messages=[]),
            Conversation(id="u", messages=[_turn("user")])]
    skipped = {}
    assert [c.id for c in answerable(rows, skipped, tmp_path / "c.jsonl")] == ["u"]
    assert skipped == {"no_user_or_assistant_turn": 2}


def test_token_id_0_is_a_token_id(monkeypatch):
    """Kept as the server sampled it (`<unk>` or `!` in many vocabularies), not refused as no id."""
    answering(monkeypatch, {"role": "assistant", "content": "!a"}, token_ids=[0, 64, 2])
    assert ask(ServerConfig(url=URL, model="m"), [_turn("user", "q")], None, 0) == ({"content": "!a"}, [0, 64, 2])


def test_an_answer_the_target_ends_at_once_is_empty(random_llama):
    """Nothing forces a first token: where the end token wins there, the answer is empty, and stopped."""
    target = load_target(random_llama)
    conv = Conversation(id="c", messages=[_turn("user", "Why?")])
    ((_, ids),) = generate_texts(target, [render(target.tokenizer, conv.messages, True)],
                                 generation_config(target, 0.0, 3))
    (end,) = stop_token_ids(target)
    with torch.no_grad():
        target.model.lm_head.weight[end] = target.model.lm_head.weight[ids[0]] * 1.05
    (out,) = regenerate(target, [conv], max_new_tokens=3, show_progress=False)
    assert {k: out.messages[1][k] for k in ("content", "token_ids", "finish_reason")} == \
        {"content": "", "token_ids": [], "finish_reason": "stop"}


@pytest.mark.parametrize("message, choice, said", [
    ({"content": "ok"}, {"token_ids": [5, -1]}, "choices[0].token_ids is not a list of token ids: [5, -1]"),
    ({"content": "", "tool_calls": {"name": "size", "arguments": "{}"}}, {},
     "choices[0].message.tool_calls is not a list: {'name': 'size', 'arguments': '{}'}"),
    ({"content": "ok", "reasoning_content": ["a", "b"]}, {}, "choices[0].message.reasoning_content is list, not text: ['a', 'b']"),
    ({"content": "ok", "reasoning_content": "", "reasoning": 3}, {}, "choices[0].message.reasoning is int, not text: 3"),
])
def test_a_malformed_answer_is_one_line_quoting_what_the_server_sent(monkeypatch, message, choice, said):
    answering(monkeypatch, {"role": "assistant", **message}, **choice)
    with pytest.raises(LabError) as e:
        ask(ServerConfig(url=URL, model="m"), [_turn("user", "q")], None, 0)
    assert str(e.value) == f"{ENDPOINT}: server answer's {said}"


def test_think_tags_kept_leave_the_other_special_tokens_out(random_llama):
    """Only the tags stay as text, with all the text around them: any other special token the target wrote,
    before them or after, is left out as from an answer without tags."""
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    ids = tok("Hm<|im_start|><think>So.</think>It is.<|im_start|>", add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2
    assert answer_fields(tok, tok.decode(ids, skip_special_tokens=True), ids) == {"content": "Hm<think>So.</think>It is."}


@pytest.mark.parametrize("choice", [{}, {"finish_reason": "stop", "token_ids": [7, 2]}])
def test_an_answer_keeps_the_finish_reason_a_server_gave_last_and_none_it_did_not(monkeypatch, choice):
    answering(monkeypatch, {"role": "assistant", "content": "new"}, **choice)
    conv = Conversation(id="c", messages=[_turn("user", "q"), _turn("assistant", "old", finish_reason="length")])
    (_, answer) = regenerate_server._regenerate_one(ServerConfig(url=URL, model="m"), conv).messages
    sampled = {"token_ids": [7, 2], "temperature": 0.0, "finish_reason": "stop"} if choice else {}
    assert list(answer.items()) == [("role", "assistant"), ("content", "new"), *sampled.items()]
