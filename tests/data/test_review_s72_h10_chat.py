"""Review s72 (h10): chat.py's _tokenize .. encode_conversation, pinned where mutants lived."""
from __future__ import annotations

import pytest
from test_data_chat import templated

from drafter_lab.data.chat import TemplateRefusal, dropped_reasoning, encode_conversation, served_text
from drafter_lab.data.conversations import CUT
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


class Offsetless:
    """A tokenizer without character offsets, raising as transformers 4's Python ("slow") tokenizers do, or as
    transformers 5's mistral-common backend does."""

    def __init__(self, tok, error: Exception):
        self._tok, self._error = tok, error

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self):
        return len(self._tok)

    def __call__(self, text, **kwargs):
        if kwargs.get("return_offsets_mapping"):
            raise self._error
        return self._tok(text, **kwargs)


@pytest.mark.parametrize("error", [
    NotImplementedError("return_offset_mapping is not available when using Python tokenizers"),
    ValueError("`MistralCommonBackend` does not support `return_offsets_mapping` and `split_special_tokens`."),
], ids=["slow", "mistral-common"])
def test_a_tokenizer_without_offsets_is_refused_in_one_line(random_llama, error):
    with pytest.raises(LabError, match=r"^tokenizer gives no character offsets \(a fast tokenizer is needed\)$"):
        encode_conversation(Offsetless(templated(random_llama, PLAIN), error), CHAT, 4096)


def test_another_value_error_of_the_tokenizer_is_not_called_one_without_offsets(random_llama):
    with pytest.raises(ValueError, match="^text too long$"):
        encode_conversation(Offsetless(templated(random_llama, PLAIN), ValueError("text too long")), CHAT, 4096)


def renders(tok, monkeypatch) -> list[int]:
    """The chat template renders made from here on (one entry each)."""
    calls: list[int] = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_conversation_without_thinking_counts_none_unrendered(random_llama, monkeypatch):
    tok = templated(random_llama, PLAIN)
    calls = renders(tok, monkeypatch)
    assert dropped_reasoning(tok, CHAT) == (0, 0) and not calls


def test_the_served_text_a_caller_has_is_not_rendered_again(random_llama, monkeypatch):
    """`text` spares the render the caller made: dropped_reasoning reads it alone, and encode_conversation
    renders less (and encodes alike)."""
    tok = templated(random_llama, PLAIN)
    chat = [CHAT[0], {**CHAT[1], "reasoning_content": "Greet."}]
    text = served_text(tok, chat, frozenset(), None, None)
    unsent = encode_conversation(tok, chat, 4096)
    calls = renders(tok, monkeypatch)
    assert dropped_reasoning(tok, chat, text=text) == (1, 1) and not calls
    sent = encode_conversation(tok, chat, 4096, text=text)
    with_text = len(calls)
    assert [t.tolist() for t in sent] == [t.tolist() for t in unsent]
    calls.clear()
    encode_conversation(tok, chat, 4096)
    assert with_text < len(calls)


def test_an_answer_past_a_header_without_an_end_token_is_refused_token_exact(random_llama):
    """Token-exact, an answer the template writes after a header of its own is placed up to the turn's
    end-of-turn token: under a template that writes none, it is not looked for to the end of the text."""
    tok = templated(random_llama, "{% for m in messages %}{{ m['role'] }}: "
                                  "{% if m['role'] == 'assistant' %}Sure. {% endif %}{{ m['content'] }}\n{% endfor %}")
    turn = {**CHAT[1], "token_ids": tok("Hello.", add_special_tokens=False)["input_ids"]}
    with pytest.raises(TemplateRefusal, match="chat template rewrites assistant turn 1"):
        encode_conversation(tok, [CHAT[0], turn], 4096, True)


def test_a_cut_turn_with_nothing_written_trains_no_end_token(random_llama):
    """Cut at its token limit before any answer, the turn's end-of-turn token is the template's, not the
    target's (it had not stopped): nothing of the turn is masked."""
    tok = templated(random_llama, load_tokenizer(random_llama).chat_template)  # ChatML
    end_ids = frozenset(tok.convert_tokens_to_ids(["<|im_end|>"]))
    cut = {"role": "assistant", "content": "", "reasoning_content": "Hmm", "finish_reason": CUT}
    ids, mask = encode_conversation(tok, [CHAT[0], cut], 4096, end_ids=end_ids)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<|im_end|>\n") and not mask.any()


def test_a_cut_turn_the_template_ends_nothing_after_trains_to_its_last_token(random_llama):
    """Cut at its token limit under a template that writes no end-of-turn token (nor anything after the
    answer), the turn's last token is the target's last: it is masked."""
    tok = templated(random_llama, "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")
    cut = {"role": "assistant", "content": "Hello there", "finish_reason": CUT}
    ids, mask = encode_conversation(tok, [CHAT[0], cut], 4096)
    assert mask[-1] and tok.decode(ids[mask]).endswith("Hello there")
