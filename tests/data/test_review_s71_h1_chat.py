"""Review of session 71 (h1), chat.py: a record whose chat_template_kwargs are no object (or whose day is
no day) pins no day, and the resume it came from is refused naming its file, where it raised a bare
TypeError; and loss-mask behaviours of chat.py that a mutation audit found no test pinned."""

from __future__ import annotations

import json

import pytest
from data_helpers import clock_at, make_conversations, write_jsonl

from drafter_lab.data.capture import CaptureConfig, prepare_features
from drafter_lab.data.capture_config import TEMPLATE_DATE
from drafter_lab.data.chat import pinned, rendered_with
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

# Mistral Small 3.1's head: the clock, whatever the variables.
CLOCK = '{%- set today = strftime_now("%Y-%m-%d") %}{{- "Today is " + today + ".\\n" }}'
DAY1, DAY2 = "2026-12-04", "2026-12-05"


@pytest.fixture
def clock_tok(random_llama, monkeypatch):
    tok = load_tokenizer(random_llama)
    tok.chat_template = CLOCK + tok.chat_template
    clock_at(monkeypatch, DAY2)
    return tok


@pytest.mark.parametrize("kwargs", [5, "template_date", ["template_date"], True, [], "", 0,
                                    {TEMPLATE_DATE: 20261204}, {TEMPLATE_DATE: "4 Dec 2026"}])
def test_a_record_of_unreadable_variables_pins_no_day(clock_tok, kwargs):
    """5 and "template_date" raised a bare TypeError; a falsy one ([], "") was read as no variables, which
    kept the run unpinned; a day that is no day was pinned, to fail at the first render without the file
    it came from. Such a record is passed over: the next one's day, else today's."""
    bad = {**rendered_with(clock_tok, None), "chat_template_kwargs": kwargs}
    assert pinned(clock_tok, None, [bad]) == {TEMPLATE_DATE: DAY2}
    good = rendered_with(clock_tok, {TEMPLATE_DATE: DAY1})
    assert pinned(clock_tok, {"a": 1}, [bad, good]) == {"a": 1, TEMPLATE_DATE: DAY1}


def test_a_record_without_variables_still_resumes_unpinned(clock_tok):
    """Work begun before the lab pinned the day (no variables, or null ones) resumes as it was made."""
    old = rendered_with(clock_tok, None)
    assert "chat_template_kwargs" not in old
    assert pinned(clock_tok, None, [old]) is None
    assert pinned(clock_tok, {"a": 1}, [{**old, "chat_template_kwargs": None}]) == {"a": 1}


def test_a_manifest_with_unreadable_variables_is_refused_naming_it(random_llama, tmp_path, monkeypatch):
    """End to end: the capture it resumes is refused in one line naming its manifest, not a TypeError."""
    from transformers import LlamaForCausalLM

    model = tmp_path / "model"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(model)
    tok = load_tokenizer(random_llama)
    tok.chat_template = CLOCK + tok.chat_template
    tok.save_pretrained(model)
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(2))
    cfg = CaptureConfig(max_length=128, shard_size=2, batch_size=2, val_fraction=0.0)
    clock_at(monkeypatch, DAY1)
    out = tmp_path / "feat"
    prepare_features(model, convs, out, cfg)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["source"]["chat_template_kwargs"] = 5
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LabError) as e:
        prepare_features(model, convs, out, cfg)
    assert str(e.value).startswith(f"{out / 'manifest.json'}: manifest was made with other settings "
                                   "(chat_template_kwargs: 5 there")
    assert "\n" not in str(e.value)


OTHER_CLOCK = """
import sys, time
from transformers.utils import chat_template_utils
from drafter_lab.data.chat import render
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

compile_ = chat_template_utils._cached_compile_jinja_template

def compiled(template):  # a transformers whose strftime_now reads the clock through `time`
    jinja = compile_(template)
    jinja.globals["strftime_now"] = time.strftime
    return jinja

chat_template_utils._cached_compile_jinja_template = compiled
tok = load_tokenizer(sys.argv[1])
tok.chat_template = sys.argv[2] + tok.chat_template
try:
    print(render(tok, [{"role": "user", "content": "Hi"}], template_kwargs={"template_date": "2001-01-01"}))
except LabError as e:
    print(f"error: {e}")
"""


def test_a_transformers_that_reads_the_clock_otherwise_is_refused(random_llama):
    """Checked once per process, on a probe template, before the first pinned render: unchecked, such a
    transformers rendered today where the run records another day. A fresh interpreter, as the check
    holds for the process once made."""
    import subprocess
    import sys
    from pathlib import Path

    import drafter_lab

    root = Path(drafter_lab.__file__).resolve().parent.parent  # the package under test, not an installed one
    done = subprocess.run([sys.executable, "-c", OTHER_CLOCK, str(random_llama), CLOCK], cwd=root,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ("error: this transformers reads the chat template's clock otherwise: cannot "
                                   "render template_date 2001-01-01")


# ChatML that writes answers upper-cased: the answer's own text is nowhere in the render.
UPPER = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
         "{{ m['content'] | upper if m['role'] == 'assistant' else m['content'] }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("reason, trained", [(None, "HELLO THERE<|im_end|>"), ("length", "HELLO THERE")])
def test_a_cut_answer_the_template_rewrites_trains_up_to_the_end_token(random_llama, reason, trained):
    """Where a cut answer's text is not found (the template rewrites it), its mask runs from the turn's
    start up to the token before its end-of-turn token: neither nothing nor that token too."""
    from drafter_lab.data.chat import encode_conversation

    tok = load_tokenizer(random_llama)
    tok.chat_template = UPPER
    end = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    turn = {"role": "assistant", "content": "hello there", **({"finish_reason": reason} if reason else {})}
    ids, mask = encode_conversation(tok, [{"role": "user", "content": "Say hi."}, turn], 4096, False, end)
    assert tok.decode(ids[mask]) == trained
