"""A conversation that ends in a tool result (an agent's trace cut where its tool returned, as a request
served mid-task is) gets the target's answer after it when regenerated, as a trailing user turn does: it
was left as it came, so its regeneration wrote nothing after the result. A journal from before is refused."""

from __future__ import annotations

import json

import pytest
from data_helpers import run_cli, write_jsonl
from test_data_regenerate_server import serving
from test_data_tools import TOOLS, hermes_llama, row  # noqa: F401  (the fixture)

from drafter_lab.data.chat import render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import (
    ANSWERS_PROMPTS,
    ANSWERS_TOOL_RESULTS,
    answer_slots,
    answers_prompts,
    generate_texts,
    generation_config,
    refuse_unanswering_journal,
    regenerate,
    regeneration_settings,
    unanswered,
)
from drafter_lab.data.shards import Manifest
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.targets.hf import load_target

GEN = ("--max-new-tokens", "6", "--seed", "0")


def cut(cid: str = "cut-0", path: str = "setup.py") -> dict:
    """test_data_tools' row less its answer: [system, user, calls, result]."""
    r = row(cid, path)
    return {**r, "messages": r["messages"][:4]}


@pytest.mark.parametrize("roles, gaps", [
    (["user", "assistant", "tool"], [2]),
    (["user", "assistant", "tool", "tool"], [3]),  # two results of one turn's calls: answered after both
    (["user", "assistant", "tool", "assistant"], []),
    (["assistant", "tool", "user"], [2]),  # a user turn after a result speaks for it
    (["user", "tool"], [0, 1]),
])
def test_a_trailing_tool_result_waits_for_an_answer(roles, gaps):
    messages = [{"role": r, "content": r} for r in roles]
    assert unanswered(messages) == gaps
    slotted = answer_slots(messages)
    assert unanswered(slotted) == [] and [slotted[j + 1 + k] for k, j in enumerate(gaps)] == \
        [{"role": "assistant", "content": ""}] * len(gaps)


def test_the_settings_say_which_turns_are_answered(tmp_path):
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [cut(), row()]))
    prompt, _ = read_conversations(write_jsonl(tmp_path / "p.jsonl", [{"id": "p", "messages": [
        {"role": "user", "content": "q"}]}]), prompts=True)
    assert answers_prompts(convs) == ANSWERS_TOOL_RESULTS
    assert answers_prompts(convs + prompt) == {**ANSWERS_PROMPTS, **ANSWERS_TOOL_RESULTS}
    assert answers_prompts(convs[1:]) == {}
    journal = tmp_path / "out.jsonl.partial"
    refuse_unanswering_journal(ANSWERS_TOOL_RESULTS, ANSWERS_TOOL_RESULTS, journal)
    with pytest.raises(LabError) as e:
        refuse_unanswering_journal(ANSWERS_PROMPTS, {**ANSWERS_PROMPTS, **ANSWERS_TOOL_RESULTS}, journal)
    assert str(e.value).startswith(f"{journal}: begun before the lab recorded that it answers a tool result that "
                                   "ends a conversation:")


def test_local_regeneration_answers_after_the_last_result(hermes_llama, tmp_path):  # noqa: F811
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [cut(), cut("cut-1", "noxfile.py")]))
    target = load_target(hermes_llama)
    out = regenerate(target, convs, max_new_tokens=6, show_progress=False)
    for before, after in zip(convs, out):
        assert after.messages[:4] == before.messages and len(after.messages) == 5
        prompt = render(target.tokenizer, before.messages, True, tools=TOOLS)
        ((text, ids),) = generate_texts(target, [prompt], generation_config(target, 0.0, 6))
        assert (after.messages[4]["content"], after.messages[4]["token_ids"]) == (text, ids)


def test_served_answers_equal_local_and_prepare_records_them(hermes_llama, tmp_path):  # noqa: F811
    convs = write_jsonl(tmp_path / "c.jsonl", [cut(), cut("cut-1", "noxfile.py")])
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", hermes_llama, *GEN) == 0
    with serving(hermes_llama, tmp_path) as (url, _):
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                       "--server", url, *GEN) == 0
    local = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    served = [json.loads(line) for line in (tmp_path / "served.jsonl").read_text().splitlines()]
    key = ("role", "content", "token_ids")
    assert [[{k: m.get(k) for k in key} for m in r["conversations"]] for r in served] == \
        [[{k: m.get(k) for k in key} for m in r["conversations"]] for r in local]
    assert all(r["conversations"][-1]["role"] == "assistant" and r["conversations"][-1]["token_ids"] for r in local)
    assert run_cli("data", "prepare", "--target", hermes_llama, "--conversations", convs, "--out", tmp_path / "f",
                   "--regenerate", *GEN, "--val-fraction", "0") == 0
    assert Manifest.load(tmp_path / "f").source["regenerate"]["tool_results_ending_a_conversation"] == "answered"


def test_a_journal_from_before_tool_answers_is_refused(hermes_llama, tmp_path, cli_error):  # noqa: F811
    source = write_jsonl(tmp_path / "c.jsonl", [cut()])
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    older = regeneration_settings(load_target(hermes_llama), source, 0.0, 6, 16, 0)  # as it recorded them
    with Journal(partial, older) as journal:
        journal.append({"round": 0, "answers": {}, "token_ids": {}})
    assert cli_error(["data", "regenerate", "--conversations", str(source), "--out", str(out),
                      "--target", str(hermes_llama), *GEN]) == (
        f"error: {partial}: begun before the lab recorded that it answers a tool result that ends a conversation: "
        "its answers may be those of other turns than they would fill now; delete it to start over")
    assert partial.exists() and not out.exists()
