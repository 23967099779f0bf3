"""Review of journals and regeneration input: a journal's settings and records as strict JSON, a conversations
file's NaN and Infinity, a served regeneration's failure naming its conversations file, and a `<out>.partial`
journal that is one of the inputs."""

from __future__ import annotations

import json
import math

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.spec.sweep import format_sweep, run_sweep


def _strict(line: str):
    """`line` as strict JSON: NaN and Infinity refused, as jq, JSON.parse and serde_json refuse them."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize("bad", [math.nan, math.inf, [1.0, -math.inf]])
def test_settings_without_a_json_number_are_refused_up_front(tmp_path, bad):
    """A NaN in the settings was written as NaN and compared with ==: never equal to itself, it refused every
    resume of the journal as one made with other settings (after the work was done once)."""
    path = tmp_path / "run.partial"
    with pytest.raises(LabError, match=f"^{path}: settings temperature hold a number JSON has not"):
        Journal(path, {"seed": 1, "temperature": bad})
    assert not path.exists()


def test_settings_resume_as_they_read_back(tmp_path):
    """Settings holding a tuple or a number key read back as a list and a text key: != the settings, so the
    journal refused its own resume."""
    path, settings = tmp_path / "run.partial", {"ids": (2, 4), "by_layer": {3: "x"}}
    with Journal(path, settings) as journal:
        journal.append({"n": 1})
    assert Journal(path, settings).records == [{"n": 1}]


def test_records_are_strict_json_and_a_nan_reads_back_null(tmp_path):
    path = tmp_path / "run.partial"
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"loss": math.nan, "rows": [1.5, math.inf], "text": "ü"})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [_strict(line) for line in lines][1] == {"loss": None, "rows": [1.5, None], "text": "ü"}
    assert Journal(path, {"seed": 1}).records == [{"loss": None, "rows": [1.5, None], "text": "ü"}]


def test_a_resumed_sweep_row_without_an_accept_length_prints(tmp_path):
    """A setting with no verify step (served_accept_len NaN) comes back from the journal as null: its row
    was a TypeError traceback in format_sweep, after the sweep's decoding."""
    row = {"config": {"steps": 1, "topk": 1, "draft_tokens": 1, "batch_size": 1}, "spec_tok_s": 3.0}
    path, settings = tmp_path / "sweep.json.partial", [{"steps": 1}]
    with Journal(path, {"seed": 1}) as journal:
        run_sweep(settings, lambda s: {**row, "served_accept_len": math.nan}, journal)
    resumed = run_sweep(settings, lambda s: pytest.fail("decoded again"), Journal(path, {"seed": 1}))
    assert resumed[0]["served_accept_len"] is None
    assert format_sweep(resumed).splitlines()[2].split("|")[1].split()[0] == "-"


def test_a_journal_path_that_is_a_directory_is_one_line(tmp_path):
    path = tmp_path / "out.jsonl.partial"
    path.mkdir()
    for write in (True, False):
        with pytest.raises(LabError, match=f"^{path}: is a directory, not a journal"):
            Journal(path, {"seed": 1}, write=write)


def test_a_file_of_no_whole_line_that_is_no_journal_is_left_alone(tmp_path):
    """A file without a newline was taken for a journal killed mid-header and cut to nothing at the first
    append: an input given as `<out>.partial` (one conversation, no last newline) was wiped."""
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "conversations": []}')
    with pytest.raises(LabError, match=f"^{path}: is not a journal this lab wrote"):
        Journal(path, {"seed": 1})
    assert path.read_text() == '{"id": "a", "conversations": []}'
    path.write_text('{"settings": {"se')  # a header a kill cut short: cut back to nothing, as before
    with Journal(path, {"seed": 1}) as journal:
        journal.append({"n": 1})
    assert Journal(path, {"seed": 1}).records == [{"n": 1}]


TURNS = '"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"%s}]'
CALL = ('"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": '
        '[{"function": {"name": "f", "arguments": %s}}]}, {"role": "tool", "content": "r"}, '
        '{"role": "assistant", "content": "a"}]')


@pytest.mark.parametrize("row, said", [
    ('{"id": NaN, ' + TURNS % "" + "}", "id has NaN"),  # read as the id "nan"
    ('{"id": Infinity, ' + TURNS % "" + "}", "id has Infinity"),
    ('{"id": 1e999, ' + TURNS % "" + "}", "id has Infinity"),  # past a double's range: inf
    ('{"tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": NaN}}}], '
     + TURNS % "" + "}", "tools has NaN"),
    ("{" + CALL % '{"x": -Infinity}' + "}", "a tool call's arguments hold -Infinity"),
    ("{" + CALL % '"{\\"x\\": NaN}"' + "}", "a tool call's arguments hold NaN"),  # a JSON string of them
    ("{" + TURNS % ', "token_ids": [1], "rendered_with": {"k": NaN}' + "}", "turn 2 has NaN"),
])
def test_a_nan_the_lab_would_keep_is_one_line_naming_the_file_and_line(tmp_path, row, said):
    """Python's json reads NaN and Infinity: they went on into the regenerated file and its journal as no
    JSON (and an id NaN named the conversation "nan")."""
    path = write_jsonl(tmp_path / "c.jsonl", [make_conversations(1)[0], row])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 2: {said}, which is not a JSON number"


def test_a_nan_in_a_column_the_lab_does_not_read_is_left_alone(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ['{"score": NaN, ' + TURNS % "" + "}"])
    assert len(read_conversations(path)[0]) == 1


def _served(tmp_path, monkeypatch, answer, convs=None, *flags):
    convs = convs or write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    monkeypatch.setattr(regenerate_server, "request_json", lambda url, body, **kw: answer)
    return run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "out.jsonl", "--server",
                   "http://127.0.0.1:9", "--model", "m", "--concurrency", "1", *flags)


def test_a_served_conversations_failure_names_the_file_as_a_local_ones_does(tmp_path, monkeypatch, capsys):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    assert _served(tmp_path, monkeypatch, {"choices": [{"message": None}]}, convs) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {convs}: conversation ") and "no text at choices[0].message.content" in err
    assert _served(tmp_path, monkeypatch, {}, convs, "--concurrency", "0") == 2  # not about the file: unnamed
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --concurrency must be >= 1, got 0"


def test_a_servers_nan_arguments_are_refused(tmp_path, monkeypatch, capsys):
    answer = {"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"x": NaN}'}}]}}]}
    assert _served(tmp_path, monkeypatch, answer) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "server answer: a tool call's arguments hold NaN, which is not a JSON number" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_an_input_at_the_journals_path_is_refused_untouched(tmp_path, monkeypatch, capsys):
    """`--out x.jsonl` with `--conversations x.jsonl.partial`: the journal is the input. One conversation
    without a last newline was cut to nothing, journalled, then deleted with the journal."""
    convs = tmp_path / "out.jsonl.partial"
    convs.write_text(json.dumps(make_conversations(1)[0]))
    before = convs.read_bytes()
    ok = {"choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "fine"}}]}
    assert _served(tmp_path, monkeypatch, ok, convs) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'out.jsonl'}: --out's journal, out.jsonl.partial, is the --conversations file; "
        "choose another --out")
    assert convs.read_bytes() == before and not (tmp_path / "out.jsonl").exists()


def test_an_eval_prompts_file_at_the_sweeps_journal_path_is_refused(tmp_path, capsys):
    prompts = write_jsonl(tmp_path / "sweep.json.partial", make_conversations(2))
    assert run_cli("eval", "--drafter", tmp_path / "d", "--target", tmp_path / "t", "--prompts", prompts,
                   "--steps", "1,2", "--json", tmp_path / "sweep.json") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'sweep.json.partial'}: --json's journal and --prompts name the same file")
