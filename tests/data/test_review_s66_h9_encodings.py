"""encodings() behaviours a mutation audit (s66, h9) found unpinned: a conversation the chat template
refuses is yielded in its place, not raised, and the progress counts it, in worker processes too."""

from __future__ import annotations

import contextlib

import pytest
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data import encodings as encodings_module
from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.chat import TemplateRefusal
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.encodings import encodings
from drafter_lab.targets.hf import load_tokenizer

REFUSE = "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('begin with a user turn') }}{% endif %}"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_refused_conversation_is_yielded_in_its_place_and_counted_in_the_progress(random_llama, tmp_path,
                                                                                     monkeypatch, workers):
    """The progress bar reaches its total whatever the template refuses (it stopped one short per
    refusal in the workers), and the refusal names its conversation where it stands in the file."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = REFUSE + tok.chat_template
    bad = {"id": "bad", "messages": [{"role": "assistant", "content": "first"}]}
    good = make_conversations(3)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [*good[:2], bad, good[2]]))
    steps = []

    @contextlib.contextmanager
    def counting(description, total, show):
        assert (description, total, show) == ("tokenize conversations", 4, True)
        yield lambda n=1, **fields: steps.append(n)

    monkeypatch.setattr(encodings_module, "maybe_progress", counting)
    cfg = CaptureConfig(max_length=4096, tokenize_workers=workers)
    out = list(encodings(convs, tok, cfg, frozenset(), show=True))
    assert [isinstance(e, TemplateRefusal) for e in out] == [False, False, True, False]
    assert str(out[2]).startswith("conversation bad: chat template rejects the conversation"), str(out[2])
    assert sum(steps) == len(convs)
