"""Review (s65) of capture_config's settings helpers: what a run records of its template variables and
device (so that older journals and manifests still match), which keys work made before they were
recorded is excused, and the line saying so."""

from __future__ import annotations

import argparse

import pytest
import torch

from drafter_lab.data import capture_config
from drafter_lab.data.capture_config import (
    STOP_IDS,
    TEMPLATE_HASH,
    TOKENIZER_HASH,
    as_recorded,
    device_setting,
    template_kwargs_arg,
    template_setting,
    unrecorded,
)


def test_no_template_variables_record_nothing():
    """`--chat-template-kwargs '{}'` is no variables: a journal or manifest begun without the flag matches."""
    assert template_setting(None) == template_setting({}) == {}
    assert template_setting({"enable_thinking": False}) == {"chat_template_kwargs": {"enable_thinking": False}}


def test_the_cpu_records_no_device_and_a_gpu_its_type():
    """Settings recorded before the device counted were all made on the CPU, and still match."""
    assert device_setting(torch.device("cpu")) == {}
    assert device_setting(torch.device("cuda", 1)) == {"device": "cuda"}  # the type, not which card


def test_a_capture_that_did_not_regenerate_is_not_excused_its_stop_tokens():
    now = {TEMPLATE_HASH: "t", TOKENIZER_HASH: "k", STOP_IDS: [2]}
    assert unrecorded({"regenerate": None, TEMPLATE_HASH: "t", TOKENIZER_HASH: "k"}, now) == []
    assert unrecorded({"regenerate": {"x": 1}, TEMPLATE_HASH: "t", TOKENIZER_HASH: "k"}, now) == [STOP_IDS]
    assert unrecorded({}, now) == [TEMPLATE_HASH, TOKENIZER_HASH, STOP_IDS]
    assert unrecorded({}, {"seed": 0}) == []


@pytest.mark.parametrize("before, said", [
    ({TOKENIZER_HASH: "k", STOP_IDS: [2]}, "begun before the lab recorded chat templates, so its template is not checked"),
    ({STOP_IDS: [2]}, "begun before the lab recorded chat templates and tokenizers, so its template and tokenizer are "
                      "not checked"),
    ({}, "begun before the lab recorded chat templates, tokenizers and stop token sets, so its template, tokenizer "
         "and stop token set are not checked"),
])
def test_work_from_before_is_told_what_goes_unchecked(monkeypatch, before, said):
    logged = []
    monkeypatch.setattr("drafter_lab.progress.log", logged.append)
    now = {"seed": 0, TEMPLATE_HASH: "t", TOKENIZER_HASH: "k", STOP_IDS: [2]}
    kept = as_recorded(before, now, "journal.partial")
    assert logged == [f"journal.partial: {said}"]
    assert kept == {k: v for k, v in now.items() if k == "seed" or k in before}
    logged.clear()
    assert as_recorded(None, now, "x") == now and as_recorded(now, now, "x") == now and logged == []


@pytest.mark.parametrize("text", ["1e999", '{"x": 1e999}', '{"x": [-1e400]}', '{"x": NaN}', '{"x": -Infinity}'])
def test_template_variables_past_a_doubles_range_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        template_kwargs_arg(text)


@pytest.mark.parametrize("sign", ["", "-"])
def test_template_variables_past_pythons_digit_limit_are_named_and_not_echoed_whole(sign):
    """A 5000-digit integer: Python's own message (which suggests sys.set_int_max_str_digits), then all
    5008 characters of the flag again."""
    text = '{"a": ' + sign + "9" * 5000 + "}"
    with pytest.raises(argparse.ArgumentTypeError) as e:
        template_kwargs_arg(text)
    said = str(e.value)
    assert said.startswith("a number of 5000 digits is past Python's 4300-digit limit: ")
    assert said.endswith("... (5008 characters)" if sign else "... (5007 characters)") and len(said) < 250
    assert template_kwargs_arg('{"a": -' + "9" * 4300 + "}")["a"] == -int("9" * 4300)  # at the limit: read


def test_without_a_digit_limit_a_long_integer_is_read(monkeypatch):
    """PYTHONINTMAXSTRDIGITS=0 turns the limit off: a 0 read as the limit refused every number."""
    monkeypatch.setattr("sys.get_int_max_str_digits", lambda: 0)
    assert template_kwargs_arg('{"a": 12}')["a"] == 12


def test_a_long_flag_that_is_no_object_is_shown_by_its_start():
    text = "[" + "1," * 100 + "1]"
    with pytest.raises(argparse.ArgumentTypeError, match=r"got '\[1,1,1.*'\.\.\. \(203 characters\)$"):
        template_kwargs_arg(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"got '\[1\]'$"):
        template_kwargs_arg("[1]")


@pytest.mark.parametrize("text", ["enable_thinking=false", "", "{'a': 1}", "[]", "1", "null"])
def test_template_variables_that_are_no_json_object_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a JSON object like"):
        template_kwargs_arg(text)


@pytest.mark.parametrize("day", ["20261205", "2026-12-5", "2026-02-30", "2026-W49-1", 20261205])
def test_a_template_date_not_written_yyyy_mm_dd_is_refused(day):
    with pytest.raises(ValueError, match="template_date must be a day written YYYY-MM-DD"):
        capture_config.template_date(day)
    with pytest.raises(argparse.ArgumentTypeError, match="YYYY-MM-DD"):
        template_kwargs_arg(f'{{"template_date": {day!r}}}'.replace("'", '"'))


def test_apply_chat_templates_own_arguments_are_no_variables():
    with pytest.raises(argparse.ArgumentTypeError, match="add_generation_prompt, tools: apply_chat_template's own"):
        template_kwargs_arg('{"tools": [], "add_generation_prompt": true, "enable_thinking": false}')
    assert template_kwargs_arg('{"enable_thinking": false, "template_date": "2026-12-05"}') == \
        {"enable_thinking": False, "template_date": "2026-12-05"}
