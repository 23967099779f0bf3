"""encodings() behaviours a mutation audit (s77, h11) found unpinned: an error that is not a template's
refusal stops the capture, naming its conversation, even where refusals are skipped; and the thinking a
template leaves out is counted, but for a token-exact capture, whose sampled ids hold it; and one worker
encodes in this process, without spawning one that loads the tokenizer again."""

from __future__ import annotations

import pytest
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data import encodings as encodings_module
from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.chat import TemplateRefusal
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.encodings import encoded, encodings
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer


def test_an_error_other_than_a_refusal_is_raised_though_refusals_are_skipped(random_llama, tmp_path):
    # token-exact without the target's own tokens: the data is wrong, not the template; skipping it
    # would leave a capture quietly short of conversations
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(1)))
    cfg = CaptureConfig(max_length=4096, token_exact=True)
    with pytest.raises(LabError, match=rf"conversation {convs[0].id}: assistant turn \d+ has no token_ids") as e:
        list(encodings(convs, load_tokenizer(random_llama), cfg, frozenset(), show=False))
    assert not isinstance(e.value, TemplateRefusal)


def test_thinking_the_template_leaves_out_is_counted_but_for_a_token_exact_capture(random_llama):
    tok = load_tokenizer(random_llama)  # its template shows no thinking
    answer = "It joins path parts."
    turn = {"role": "assistant", "content": answer, "reasoning_content": "They ask about join.",
            "token_ids": [*tok(answer, add_special_tokens=False)["input_ids"], tok.eos_token_id]}
    conv = Conversation("c", [{"role": "user", "content": "What does os.path.join do?"}, turn])
    ends = frozenset({tok.eos_token_id})
    assert encoded(conv, tok, CaptureConfig(max_length=4096), ends).thought == (1, 1)
    assert encoded(conv, tok, CaptureConfig(max_length=4096, token_exact=True), ends).thought == (0, 0)


def test_one_worker_encodes_in_this_process(random_llama, tmp_path, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("a process pool was started for one worker")

    monkeypatch.setattr(encodings_module, "ProcessPoolExecutor", no_pool)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(2)))
    cfg = CaptureConfig(max_length=4096, tokenize_workers=1)
    out = list(encodings(convs, load_tokenizer(random_llama), cfg, frozenset(), show=False))
    assert len(out) == 2 and all(e.mask.any() for e in out)
