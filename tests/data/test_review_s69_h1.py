"""Review of session 69 (h1): an id that is no text or number is refused, not named by its Python repr; a
tool result's content parts read as other turns' do; a conversations path with no file is one line from
its hash too (a file moved while a target loads, or a run trains, died in a traceback)."""

from __future__ import annotations

import pytest
from data_helpers import write_jsonl

from drafter_lab.data.conversations import conversations_sha256, read_conversations
from drafter_lab.data.regenerate_server import ServerConfig, _settings
from drafter_lab.errors import LabError

PAIR = [{"role": "user", "content": "How big is setup.py?"}, {"role": "assistant", "content": "2 KB."}]
CALL = {"role": "assistant", "content": None, "tool_calls": [{"name": "stat", "arguments": {"path": "setup.py"}}]}


def row(**fields) -> dict:
    return {**fields, "conversations": PAIR}


@pytest.mark.parametrize("given, kind", [(["chat", 1], "list"), ({"n": 1}, "dict"), (True, "bool"), (False, "bool")])
def test_an_id_of_another_kind_is_refused(tmp_path, given, kind):
    """Read as its repr, ["chat", 1] was the id "['chat', 1]" and true the id "True": written back out
    (regenerated, journalled) the row no longer held the id it came with."""
    path = write_jsonl(tmp_path / "c.jsonl", [row(id="a"), row(id=given)])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 2: id is {kind}, not text or a number"


def test_an_id_of_another_kind_is_refused_on_a_row_without_an_answer(tmp_path):
    """Checked as the row's shape is, before a row with nothing to train is skipped."""
    path = write_jsonl(tmp_path / "c.jsonl", [row(id="a"), {"id": [], "conversations": PAIR[:1]}])
    with pytest.raises(LabError, match=r"c\.jsonl: line 2: id is list, not text or a number$"):
        read_conversations(path)


def test_text_and_number_ids_are_read_as_text(tmp_path):
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row(id="a"), row(id=7), row(id=0), row(id=2.5)]))
    assert [c.id for c in convs] == ["a", "7", "0", "2.5"]


def test_a_tool_results_text_parts_read_as_other_turns_do(tmp_path):
    """OpenAI's content parts on a tool turn (ShareGPT's `observation` too) join with newlines."""
    parts = [{"type": "text", "text": "1024 bytes"}, {"type": "text", "text": "modified today"}]
    rows = [{"messages": [PAIR[0], CALL, {"role": "tool", "content": parts, "name": "stat"}, PAIR[1]]},
            {"conversations": [{"from": "human", "value": "How big?"}, {"from": "observation", "value": parts[:1]},
                               {"from": "gpt", "value": "1 KB."}]}]
    (calls, plain), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    assert calls.messages[2] == {"role": "tool", "content": "1024 bytes\nmodified today", "name": "stat"}
    assert plain.messages[1] == {"role": "tool", "content": "1024 bytes"}


@pytest.mark.parametrize("parts", [[{"type": "image_url", "image_url": {"url": "plot.png"}}],
                                   [{"type": "text", "text": "a plot:"}, {"type": "input_audio", "input_audio": {}}]])
def test_a_tool_results_other_parts_are_refused(tmp_path, parts):
    """A drafter of text reads no image or audio a tool returns: refused as on other turns, not taken
    as the JSON text of a result."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": [PAIR[0], CALL, {"role": "tool", "content": parts}, PAIR[1]]}])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value).startswith(f'{path}: line 1: turn content parts must all be {{"type": "text", "text": ...}}')


@pytest.mark.parametrize("make, said", [(lambda p: p, "conversations file not found"),
                                        (lambda p: p.mkdir() or p, "conversations path is a directory, not a jsonl file")])
def test_the_hash_of_a_path_with_no_file_is_one_line(tmp_path, make, said):
    """Each caller hashes a file it read before (a target may load in between): one moved since is named
    as its read names it, a LabError the CLI ends in one line with exit code 2."""
    path = make(tmp_path / "c.jsonl")
    with pytest.raises(LabError) as e:
        conversations_sha256(path)
    assert str(e.value) == f"{path}: {said}" and e.value.exit_code == 2
    with pytest.raises(LabError) as settings:  # a server regeneration's journal key
        _settings(ServerConfig(url="http://127.0.0.1:1"), path)
    assert str(settings.value) == str(e.value)
    with pytest.raises(LabError) as read:
        read_conversations(path)
    assert str(read.value) == str(e.value)  # as the read says it
