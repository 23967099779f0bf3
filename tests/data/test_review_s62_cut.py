"""Review: an answer regenerated up to --max-new-tokens was captured as if the target had finished it.
A local regeneration's `token_ids` leave the end token out, so a cut answer looked like a finished
one; the chat template wrote its end-of-turn token after the cut text, and the loss mask trained the
drafter to propose that token where the target would have gone on. Each answer now records its
`finish_reason` (as the OpenAI API names it: "length" when cut), and capture leaves the end-of-turn
token after a cut answer out of the mask; an answer without one trains it, as before."""

from __future__ import annotations

import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_chat import spans
from test_data_hidden_thinking import templated
from test_data_reasoning import THINKING
from test_data_regenerate_server import serving

from drafter_lab.data.capture import conversation_of
from drafter_lab.data.chat import encode_conversation
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import regenerate
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.targets.hf import load_target, stop_token_ids

NEW = 6


def answers_of(path) -> list[dict]:
    return [m for c in read_conversations(path)[0] for m in c.messages if m["role"] == "assistant"]


def test_a_local_regeneration_records_which_answers_it_cut(stopping_llama, tmp_path, capsys):
    target = load_target(stopping_llama)
    (end,) = stop_token_ids(target)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(6)))
    out = regenerate(target, convs, max_new_tokens=NEW, batch_size=2)
    answers = [m for c in out for m in c.messages if m["role"] == "assistant"]
    reasons = [m["finish_reason"] for m in answers]
    assert {"stop", "length"} <= set(reasons)  # the fixture stops some and cuts the others
    for m in answers:  # the ids alone cannot tell: neither kind keeps an end token
        assert end not in m["token_ids"]
        assert m["finish_reason"] == ("length" if len(m["token_ids"]) == NEW else "stop")
    assert f"{reasons.count('length')} of {len(answers)} answers reached --max-new-tokens {NEW}" in \
        " ".join(capsys.readouterr().err.split())

    # A journal of an earlier lab records no reason: its answers, replayed, get theirs all the same.
    journal = tmp_path / "regen.partial"
    with Journal(journal, {"run": 1}) as j:
        regenerate(target, convs, max_new_tokens=NEW, batch_size=2, journal=j)
    records = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert records and all(set(r) == {"round", "answers", "token_ids"} for r in records)  # as before
    with Journal(journal, {"run": 1}) as j:
        replayed = regenerate(target, convs, max_new_tokens=NEW, batch_size=2, journal=j)
    assert [c.messages for c in replayed] == [c.messages for c in out]


@pytest.mark.parametrize("exact", [False, True], ids=["text", "token-exact"])
def test_the_end_token_after_a_cut_answer_does_not_train(stopping_llama, tmp_path, exact):
    """`data prepare --regenerate` with a --max-new-tokens that cuts some answers: the mask of a cut
    answer ends with its own last token, that of a finished one with the end token the template writes."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(6))
    feat = tmp_path / "feat"
    assert run_cli("data", "prepare", "--target", stopping_llama, "--conversations", convs, "--out", feat,
                   "--regenerate", "--max-new-tokens", NEW, "--max-length", 512, "--val-fraction", 0,
                   *(["--token-exact"] if exact else [])) == 0
    (cache,) = feat.glob("regenerated-*.jsonl")
    regenerated = {c.id: [m for m in c.messages if m["role"] == "assistant"] for c in read_conversations(cache)[0]}
    target = load_target(stopping_llama)
    (end,) = stop_token_ids(target)
    seen = {"stop": 0, "length": 0}
    for seq in FeatureSet(feat).sequences("train"):
        turns = regenerated[conversation_of(seq.seq_id)]
        masked = [seq.input_ids[a:b].tolist() for a, b in spans(seq.loss_mask)]
        assert len(masked) == len(turns)
        for ids, m in zip(masked, turns):
            finished = m["finish_reason"] == "stop"
            seen[m["finish_reason"]] += 1
            assert (ids[-1] == end) == finished
            if exact:
                assert ids == m["token_ids"] + [end] * finished
            else:
                assert target.tokenizer.decode(ids) == m["content"] + target.tokenizer.decode([end]) * finished
    assert seen["stop"] and seen["length"]


def test_a_server_regeneration_keeps_the_servers_finish_reason(stopping_llama, tmp_path):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    with serving(stopping_llama, tmp_path) as (url, _):
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                       "--server", url, "--max-new-tokens", NEW) == 0
    (end,) = stop_token_ids(load_target(stopping_llama))
    answers = answers_of(tmp_path / "served.jsonl")
    assert {"stop", "length"} <= {m["finish_reason"] for m in answers}
    for m in answers:  # the server's ids end with the end token it stopped at: a cut answer's do not
        assert m["finish_reason"] == ("stop" if m["token_ids"][-1] == end else "length")


def test_answers_without_a_finish_reason_train_their_end_token_as_before(random_llama, tmp_path):
    """Older regenerations and datasets record no reason: an answer of NEW tokens trains its end token,
    token-exact or not, as it did; a reason on another turn is left out as before, and SGLang's native
    form ({"type": ...}) reads as its type."""
    target = load_target(random_llama)
    tok, ends = target.tokenizer, frozenset(stop_token_ids(target))
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(2)))
    (old,) = regenerate(target, convs[1:], max_new_tokens=NEW)
    for m in old.messages:
        m.pop("finish_reason", None)
    cut = Conversation(old.id, [dict(m, finish_reason="length") if m["role"] == "assistant" else m
                                for m in old.messages])
    for exact in (False, True):
        _, before = encode_conversation(tok, old.messages, 4096, exact, ends)
        ids, after = encode_conversation(tok, cut.messages, 4096, exact, ends)
        assert [b - a for a, b in spans(before)] == [b - a + 1 for a, b in spans(after)]  # the end token alone
        assert all(int(ids[b - 1]) in ends for _, b in spans(before))
    rows = [{"id": "a", "conversations": [{"role": "user", "content": "q", "finish_reason": "stop"},
                                          {"role": "assistant", "content": "x", "finish_reason": {"type": "length"}}]}]
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "r.jsonl", rows))
    assert conv.messages == [{"role": "user", "content": "q"},
                             {"role": "assistant", "content": "x", "finish_reason": "length"}]
    rows[0]["conversations"][1]["finish_reason"] = 3
    with pytest.raises(LabError, match="line 1: finish_reason must be text"):
        read_conversations(write_jsonl(tmp_path / "r.jsonl", rows))


def test_a_thinking_cut_trains_neither_the_close_of_the_thinking_nor_the_end_token(random_llama):
    """Behind a reasoning parser, an answer cut while thinking comes back as its thinking alone: the
    template closes the think block (`</think>`) and the turn after it, neither of which the target
    wrote. As text, the mask ends with the thinking; token-exact, with the sampled ids."""
    tok = templated(random_llama, THINKING, [])
    end = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    turn = {"role": "assistant", "content": "", "reasoning_content": "Let me count the"}
    sampled = tok("<think>\nLet me count the", add_special_tokens=False)["input_ids"]
    for reason, text, exact in ((None, "<think>\nLet me count the\n</think>\n\n<|im_end|>", "<|im_end|>"),
                                ("length", "<think>\nLet me count the", "")):
        cut = {**turn, **({"finish_reason": reason} if reason else {})}
        ids, mask = encode_conversation(tok, [{"role": "user", "content": "Count."}, cut], 4096, False, end)
        assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [text]
        ids, mask = encode_conversation(tok, [{"role": "user", "content": "Count."}, {**cut, "token_ids": sampled}],
                                        4096, True, end)
        assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == ["<think>\nLet me count the" + exact]


def test_a_cut_answer_ending_in_whitespace_trains_that_whitespace(random_llama):
    """An answer cut after a newline and indentation (code, mid-line): the whitespace is the target's, and
    trains; only the end token after it does not (the answer's text was looked for stripped)."""
    target = load_target(random_llama)
    tok, end = target.tokenizer, frozenset(stop_token_ids(target))
    answer = "def f(x):\n    return x\n\n   "
    messages = [{"role": "user", "content": "Code?"}, {"role": "assistant", "content": answer, "finish_reason": "length"}]
    ids, mask = encode_conversation(tok, messages, 4096, False, end)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [answer]
