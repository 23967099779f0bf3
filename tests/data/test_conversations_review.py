"""Conversation ids of two JSON kinds, the OpenAI API's function-calling turns from before tools, and
a regeneration journal begun on another device type."""

from __future__ import annotations

import json

import pytest
import torch
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import regeneration_settings
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import Target, load_target


def chat(cid, question: str) -> dict:
    return {"id": cid, "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "ok"}]}


def test_a_number_id_and_a_string_id_alike_as_text_are_refused(tmp_path):
    """`1` and `"1"` (two datasets merged, say) are two conversations: the second was dropped as a
    duplicate of the first."""
    path = write_jsonl(tmp_path / "c.jsonl", [chat(1, "a"), chat(2, "b"), chat("1", "c")])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f'{path}: line 3: id "1" and line 1\'s id 1 are the same as text; give the two ' \
                           "conversations distinct ids"
    # The same id written the same way is a repeated conversation, skipped as before; number ids read as text.
    path = write_jsonl(tmp_path / "same.jsonl", [chat(1, "a"), chat(1, "a"), chat("x", "b"), chat("x", "b")])
    convs, skipped = read_conversations(path)
    assert [c.id for c in convs] == ["1", "x"] and skipped == {"duplicate_id": 2}


WEATHER = {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}


def openai_row(legacy: bool, content) -> dict:
    """One weather lookup as the OpenAI API writes it: before tools (`function_call`, a `function`
    turn) or with them."""
    call = {"function_call": WEATHER} if legacy else {"tool_calls": [{"type": "function", "function": WEATHER}]}
    result = {"role": "function" if legacy else "tool", "name": "get_weather", "content": '{"temp": 3}'}
    return {"messages": [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": content, **call},
                         result, {"role": "assistant", "content": "It is 3 C."}]}


@pytest.mark.parametrize("content", [None, ""])
def test_openai_function_turns_read_as_tool_turns(tmp_path, content):
    """A `function` result was an unknown role; the call before it (on an assistant turn whose content is
    null or "") a missing content, or dropped: the same conversation as with tools, its result's name kept."""
    path = write_jsonl(tmp_path / "c.jsonl", [openai_row(True, content)])
    (conv,), skipped = read_conversations(path)
    (modern,), _ = read_conversations(write_jsonl(tmp_path / "m.jsonl", [openai_row(False, content)]))
    assert skipped == {} and conv.messages == modern.messages and conv.id == modern.id
    assert conv.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "get_weather",
                                                                               "arguments": {"city": "Oslo"}}}]
    assert conv.messages[2] == {"role": "tool", "content": '{"temp": 3}', "name": "get_weather"}


def test_a_greedy_journal_begun_on_a_gpu_is_not_resumed_on_the_cpu(random_llama, tmp_path, interrupt_at, capsys,
                                                                    monkeypatch):
    """A GPU rounds otherwise, so its greedy answers can differ: resumed on the CPU, the journal's batches were
    replayed beside the CPU's own. A CPU run records no device, as journals did before."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    gen = dict(temperature=0.0, max_new_tokens=4, batch_size=2, seed=0)
    args = ("data", "regenerate", "--conversations", convs, "--target", random_llama, "--batch-size", "2",
            "--max-new-tokens", "4", "--out", out)
    interrupt_at(2)
    assert run_cli(*args) == 130
    head, *records = partial.read_text().splitlines()
    target = load_target(random_llama)
    assert json.loads(head)["settings"] == regeneration_settings(target, convs, **gen)
    assert "device" not in json.loads(head)["settings"]
    with monkeypatch.context() as m:  # the journal as a run on a GPU begins it
        m.setattr(Target, "device", property(lambda self: torch.device("cuda")))
        on_gpu = regeneration_settings(target, convs, **gen)
    partial.write_text("\n".join([json.dumps({"settings": on_gpu}), *records]) + "\n")
    interrupt_at(None)
    capsys.readouterr()
    assert run_cli(*args) == 2
    assert f"{partial}: partial run made with other settings" in capsys.readouterr().err
    assert not out.exists()
