"""`turns`: which assistant turns of a conversation train. `all` (one sequence, earlier turns as later
prompts show them), `last` (SpecForge's --train-only-last-turn: the last turn alone, the conversation
cut after it) and `each` (one sequence per assistant turn, cut after it), under which every turn trains
as served: its thinking too, where the template hides it from later prompts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from data_helpers import PREPARE_ARGS, make_conversations, run_cli, write_jsonl
from test_data_chat import masked, spans, word_by_word
from test_data_harmony import HARMONY_TOOLS, tool_loop
from test_data_harmony import SPECIAL as HARMONY_SPECIAL
from test_data_harmony import stops as harmony_stops
from test_data_hidden_thinking import K2_THINKING, K25, KIMI_SPECIAL, R1_MANNER, stops, templated
from test_data_reasoning import THINKING

from drafter_lab.data import chat as chat_module
from drafter_lab.data.capture import (
    CaptureConfig,
    check_config,
    conversation_of,
    prepare_features,
    sequences_of,
    split_of,
    tokenize_conversations,
)
from drafter_lab.data.chat import dropped_calls, dropped_reasoning, encode_conversation, render
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_tokenizer

ASKED = [{"role": "system", "content": "You explain Python source."},
         {"role": "user", "content": "What does os.path.join do?"}]
THOUGHTS = ["They ask about join.", "Now split, the inverse."]
ANSWERS = ["It joins path parts.", "It splits a path in two."]
CHAT = [*ASKED, {"role": "assistant", "content": ANSWERS[0], "reasoning_content": THOUGHTS[0]},
        {"role": "user", "content": "And os.path.split?"},
        {"role": "assistant", "content": ANSWERS[1], "reasoning_content": THOUGHTS[1]},
        {"role": "user", "content": "Thanks."}]  # a trailing turn nobody answered

TEMPLATES = {  # template, its special tokens, its end-of-turn token
    "qwen3": (THINKING, [], "<|im_end|>"),
    "deepseek-r1": (R1_MANNER, None, "<｜end▁of▁sentence｜>"),
    "kimi-k2-thinking": (K2_THINKING, KIMI_SPECIAL, "<|im_end|>"),
    "kimi-k2.5": (K25, KIMI_SPECIAL, "<|im_end|>"),
}


def tokenizer(random_llama, name):
    template, special, end = TEMPLATES[name]
    tok = templated(random_llama, template) if special is None else templated(random_llama, template, special)
    return tok, stops(tok, end)


def test_sequences_cut_after_the_turns_they_train():
    conv = Conversation("c", CHAT)
    assert sequences_of([conv], "all") == [conv]
    (last,) = sequences_of([conv], "last")
    assert (last.id, last.messages) == ("c", CHAT[:5])  # the trailing user turn is no prompt of any answer
    each = sequences_of([conv, Conversation("d", ASKED)], "each")  # d has no assistant turn: no sequence
    assert [(s.id, s.messages) for s in each] == [("c#turn1", CHAT[:3]), ("c#turn2", CHAT[:5])]


def test_a_conversations_sequences_share_its_split():
    """No val answer may sit in the prompt of a train sequence cut after a later turn."""
    ids = [f"chat-{i}" for i in range(200)]
    assert {split_of(f"{c}#turn{k}", 0.3) == split_of(c, 0.3) for c in ids for k in (1, 2, 17)} == {True}
    assert {split_of(c, 0.3) for c in ids} == {"train", "val"}
    assert conversation_of("chat-3#turn12") == "chat-3"
    assert conversation_of("a#turn1b") == "a#turn1b" and conversation_of("a#turns") == "a#turns"


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_each_turn_trains_its_thinking_as_served(random_llama, name):
    """Under `all` these templates hide the first answer's thinking from the later prompt, so it trains
    without; cut after it, it trains as the target wrote it."""
    tok, end_ids = tokenizer(random_llama, name)
    ids, mask = encode_conversation(tok, CHAT[:5], 10_000, end_ids=end_ids)
    first, second = masked(tok, ids, mask)
    assert THOUGHTS[0] not in first and ANSWERS[0] in first
    assert THOUGHTS[1] in second and ANSWERS[1] in second
    assert dropped_reasoning(tok, CHAT[:5]) == (2, 1)
    assert dropped_reasoning(tok, CHAT) == (2, 2)  # the trailing user turn hides the last answer's too
    for k, seq in enumerate(sequences_of([Conversation("c", CHAT)], "each")):
        ids, mask = encode_conversation(tok, seq.messages, 10_000, end_ids=end_ids, last_only=True)
        (trained,) = masked(tok, ids, mask)
        assert THOUGHTS[k] in trained and trained.endswith(f"{ANSWERS[k]}{TEMPLATES[name][2]}")
        # Right after the prompt the target saw: the render of the turns before, with its generation prompt.
        assert tok.decode(ids[:spans(mask)[0][0]]) == render(tok, seq.messages[:-1], True)
        assert dropped_reasoning(tok, seq.messages, last_only=True) == (1, 0)


@pytest.mark.parametrize("name", [None, *TEMPLATES])
def test_last_only_masks_the_last_turn_as_all_does(random_llama, name):
    """The last turn's mask is the one `all` gives it; the earlier turns are prompt."""
    tok, end_ids = (load_tokenizer(random_llama), frozenset()) if name is None else tokenizer(random_llama, name)
    ids, mask = encode_conversation(tok, CHAT[:5], 10_000, end_ids=end_ids)
    ids_last, mask_last = encode_conversation(tok, CHAT[:5], 10_000, end_ids=end_ids, last_only=True)
    assert torch.equal(ids, ids_last)
    assert spans(mask_last) == spans(mask)[-1:] and len(spans(mask)) == 2


def agent_trace(turns: int) -> list[dict]:
    """A conversation of `turns` thinking answers, each after its own user turn."""
    chat = [ASKED[0]]
    for k in range(turns):
        chat += [{"role": "user", "content": f"Step {k}: KeyError {k} in m{k}.py."},
                 {"role": "assistant", "content": f"Add key {k} to the dict in m{k}.py.",
                  "reasoning_content": f"A missing key, {k}."}]
    return chat


@pytest.mark.parametrize("name", [None, *TEMPLATES, "gpt-oss"])
def test_each_places_the_last_turn_as_all_does_in_a_few_renders(random_llama, tmp_path, monkeypatch, name):
    """`each` encodes n sequences of up to n turns: placing every turn in each was cubic in n (a
    40-turn trace took 1.8 s, 14x its `all`). The last turn alone is placed past the prompt before it,
    where the walk over every turn places it, in a few renders whatever the length; GPT-OSS's answer
    after a tool call, which that prompt does not begin, is placed by the walk."""
    if name == "gpt-oss":
        tok = templated(random_llama, HARMONY_TOOLS, [*HARMONY_SPECIAL, "<|call|>"])
        end_ids, conv = harmony_stops(tok), tool_loop(tmp_path, calls=2)
    else:
        tok, end_ids = (load_tokenizer(random_llama), frozenset()) if name is None else tokenizer(random_llama, name)
        conv = Conversation("c", agent_trace(12))
    renders = []
    monkeypatch.setattr(chat_module, "render", lambda *a, **k: renders.append(1) or render(*a, **k))
    for seq in sequences_of([conv], "each"):
        ids, mask = encode_conversation(tok, seq.messages, 10_000, end_ids=end_ids, tools=conv.tools)
        renders.clear()
        ids_last, mask_last = encode_conversation(tok, seq.messages, 10_000, end_ids=end_ids, tools=conv.tools,
                                                  last_only=True)
        assert torch.equal(ids, ids_last) and spans(mask_last) == spans(mask)[-1:]
    if name != "gpt-oss":
        assert len(renders) <= 8  # the walk renders twice per turn: 24 for the last sequence


def test_token_exact_each_turn_trains_its_sampled_ids(random_llama):
    tok, end_ids = tokenizer(random_llama, "qwen3")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = [word_by_word(tok, f"<think>\n{t}\n</think>\n\n{a}") for t, a in zip(THOUGHTS, ANSWERS)]
    chat = [{**m, "token_ids": [*sampled[k], end]} if m["role"] == "assistant" else m
            for m, k in zip(CHAT, [0, 0, 0, 0, 1, 1])]
    for k, seq in enumerate(sequences_of([Conversation("c", chat)], "each")):
        ids, mask = encode_conversation(tok, seq.messages, 10_000, token_exact=True, end_ids=end_ids, last_only=True)
        assert ids[mask].tolist() == [*sampled[k], end]
        # After the prompt the target sampled it after: the earlier turns' text as the template writes it
        # (the first thinking hidden) and tokenized, as a server reads what it is sent; not their ids.
        prompt = tok(render(tok, seq.messages[:-1], True), add_special_tokens=False)["input_ids"]
        assert ids[:spans(mask)[0][0]].tolist() == prompt
    assert THOUGHTS[0] not in tok.decode(prompt)
    del chat[2]["token_ids"]  # a prompt's turn needs no ids of its own
    ids, mask = encode_conversation(tok, chat[:5], 10_000, token_exact=True, end_ids=end_ids, last_only=True)
    assert ids[mask].tolist() == [*sampled[1], end]


def test_token_exact_passes_over_recorded_calls_only(random_llama):
    """Regeneration keeps a turn of tool calls as recorded, without ids: token-exact it trains nothing,
    so no sequence is cut after it; an answer without ids is still an error."""
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    chat = [*ASKED, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "a.py", "tool_call_id": "c1"},
            {"role": "assistant", "content": ANSWERS[0], "token_ids": [5, 6]},
            {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    conv = Conversation("c", chat)
    assert [s.id for s in sequences_of([conv], "each")] == ["c#turn1", "c#turn2", "c#turn3"]
    assert [(s.id, len(s.messages)) for s in sequences_of([conv], "each", token_exact=True)] == [("c#turn2", 5)]
    assert [len(s.messages) for s in sequences_of([conv], "last", token_exact=True)] == [5]
    target = load_target(random_llama)
    exact = CaptureConfig(turns="each", token_exact=True)
    items = tokenize_conversations(target, [Conversation("c", chat[:5])], exact, "c.jsonl", skipped := {}, main=False)
    assert [it[0] for it in items] == ["c#turn2"] and not skipped  # not a sequence with nothing to train
    bare = Conversation("d", [*ASKED, {"role": "assistant", "content": ANSWERS[0]}])
    with pytest.raises(LabError, match="conversation d#turn1: assistant turn 2 has no token_ids"):
        tokenize_conversations(target, [bare], exact, "c.jsonl", {}, main=False)


def test_counts_are_of_the_trained_turn(random_llama):
    tok = load_tokenizer(random_llama)  # ChatML: no reasoning, no calls written
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    chat = [*ASKED, {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "Look."},
            {"role": "tool", "content": "a.py", "tool_call_id": "c1"}, {"role": "assistant", "content": ANSWERS[0]}]
    assert dropped_reasoning(tok, chat) == (1, 1) and dropped_calls(tok, chat) == (1, 1)
    assert dropped_reasoning(tok, chat, last_only=True) == (0, 0) and dropped_calls(tok, chat, last_only=True) == (0, 0)
    assert dropped_reasoning(tok, chat[:3], last_only=True) == (1, 1)
    assert dropped_calls(tok, chat[:3], last_only=True) == (1, 1)


def test_tokenize_conversations_names_and_counts_the_sequences(random_llama, capsys):
    target = load_target(random_llama)
    target.tokenizer.chat_template = THINKING
    convs = [Conversation("c", CHAT), Conversation("d", CHAT[:3])]
    cfg = CaptureConfig(turns="each")
    items = tokenize_conversations(target, convs, cfg, "c.jsonl", skipped := {}, main=True)
    assert [it[0] for it in items] == ["c#turn1", "c#turn2", "d#turn1"] and not skipped
    assert "leaves out the reasoning" not in capsys.readouterr().err
    tokenize_conversations(target, convs, dataclasses.replace(cfg, turns="all"), "c.jsonl", {}, main=True)
    assert "leaves out the reasoning of 2 of 3" in " ".join(capsys.readouterr().err.split())
    (c, cut), (d, whole) = [(it[0], it[2]) for it in tokenize_conversations(
        target, convs, dataclasses.replace(cfg, turns="last"), "c.jsonl", {}, main=True)]
    assert (c, d) == ("c", "d") and len(spans(cut)) == len(spans(whole)) == 1
    assert "leaves out the reasoning" not in capsys.readouterr().err
    prompt = target.tokenizer(render(target.tokenizer, CHAT[:4], True), add_special_tokens=False)["input_ids"]
    short = dataclasses.replace(cfg, max_length=len(prompt))
    assert [it[0] for it in tokenize_conversations(target, convs, short, "c.jsonl", skipped, main=False)] == [
        "c#turn1", "d#turn1"]  # the second answer lies past max_length
    assert skipped == {"no_loss_tokens_within_max_length": 1}


def test_unknown_turns_is_an_error():
    with pytest.raises(LabError, match="unknown turns 'first'; choose one of all, last, each"):
        check_config(CaptureConfig(turns="first"))


def test_prepare_each_turn_captures_every_turn_and_resumes_only_so(random_llama, tmp_path):
    rows = make_conversations(8)
    conversations = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "feat"
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations, "--out", out,
                   "--turns", "each", *PREPARE_ARGS) == 0
    m = Manifest.load(out)
    assert m.source["turns"] == "each"
    by_id = {c.id: c for c in read_conversations(conversations)[0]}
    wanted = {s.id: s for s in sequences_of(list(by_id.values()), "each")}
    fs = FeatureSet(out)
    got = {seq.seq_id: (split, seq) for split in ("train", "val") for seq in fs.sequences(split)}
    assert got.keys() == wanted.keys() and len(got) == 2 * len(rows)
    tok = load_tokenizer(random_llama)
    for seq_id, (split, seq) in got.items():
        assert split == split_of(conversation_of(seq_id), 0.25)
        ids, mask = encode_conversation(tok, wanted[seq_id].messages, 256, last_only=True)
        assert torch.equal(seq.input_ids, ids) and torch.equal(seq.loss_mask, mask)
    with pytest.raises(LabError, match=r"other settings \(turns: 'each' there, None now\)"):
        prepare_features(random_llama, conversations, out, max_length=256, shard_size=4, batch_size=3,
                         val_fraction=0.25)


def test_turns_is_a_choice_and_online_only_in_train(random_llama, tmp_path, capsys):
    conversations = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    with pytest.raises(SystemExit) as e:
        run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations, "--out", tmp_path / "f",
                "--turns", "first")
    assert e.value.code == 2 and "invalid choice: 'first'" in capsys.readouterr().err
    assert run_cli("train", "--target", random_llama, "--data", tmp_path / "f", "--out", tmp_path / "d",
                   "--turns", "each") == 2
    assert "error: --turns applies to --conversations (online) runs only" in capsys.readouterr().err
