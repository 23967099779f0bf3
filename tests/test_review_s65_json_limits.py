"""JSON that Python's reader refuses past its limits (an integer of over 4300 digits is a ValueError that is
no JSONDecodeError; nesting too deep is a RecursionError): one line naming where, as for any bad JSON."""

from __future__ import annotations

import argparse
import json

import pytest

from drafter_lab import atomic
from drafter_lab.data.capture_config import template_kwargs_arg
from drafter_lab.data.conversations import read_conversations
from drafter_lab.drafter.formats import rope_scaling_from_text
from drafter_lab.errors import LabError

DEEP = "[" * 200_000 + "]" * 200_000
HUGE = '{"factor": ' + "9" * 5000 + "}"


@pytest.mark.parametrize("text", [DEEP, HUGE])
def test_a_json_file_past_the_readers_limits_is_one_line(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(LabError, match="not valid JSON") as e:
        atomic.read_json(path, "missing")
    assert e.value.path == str(path)


@pytest.mark.parametrize("text", [DEEP, HUGE])
def test_a_rope_scaling_flag_past_the_readers_limits_is_one_line(text):
    with pytest.raises(LabError, match="rope scaling is not JSON"):
        rope_scaling_from_text(text, "--drafter-rope-scaling")


def test_template_variables_nested_too_deep_are_refused_as_the_flag_is_read():
    with pytest.raises(argparse.ArgumentTypeError, match="expected a JSON object"):
        template_kwargs_arg('{"x": ' + DEEP + "}")


def test_tools_stored_as_json_text_nested_too_deep_name_the_file_and_line(tmp_path):
    """A dataset's `tools` column holding JSON as text: read as its shape, not a RecursionError traceback."""
    path = tmp_path / "c.jsonl"
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": DEEP}
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(LabError, match="line 1") as e:
        read_conversations(path)
    assert e.value.path == str(path)
