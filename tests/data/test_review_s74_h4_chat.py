"""Review s74 (h4): chat.py's dropped_calls .. encode_conversation (lines 641-815), pinned where mutants lived."""
from __future__ import annotations

from test_data_chat import masked, templated

from drafter_lab.data.chat import dropped_calls, encode_conversation, render
from drafter_lab.data.conversations import CUT
from drafter_lab.targets.hf import load_tokenizer

ASK = {"role": "user", "content": "Hi"}
CALL = {"type": "function", "function": {"name": "stat", "arguments": {"path": "a.txt"}}}
RESULT = {"role": "tool", "content": "2048"}
# Trims an answer, then writes a newline of its own before the end token.
TRIMS = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}\n<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_cut_answer_the_template_trims_trains_none_of_what_follows_it(random_llama):
    """A cut answer ending in whitespace that the template trims, then writes a newline of its own before
    the end token: the mask ends with the answer's text; the newline is the template's, though it begins
    where the trimmed whitespace was."""
    tok = templated(random_llama, TRIMS)
    end = frozenset(tok.convert_tokens_to_ids(["<|im_end|>"]))
    cut = {"role": "assistant", "content": "Hello there  ", "finish_reason": CUT}
    ids, mask = encode_conversation(tok, [ASK, cut], 4096, end_ids=end)
    assert masked(tok, ids, mask) == ["Hello there"]
    ids, mask = encode_conversation(tok, [ASK, {**cut, "finish_reason": "stop"}], 4096, end_ids=end)
    assert masked(tok, ids, mask) == ["Hello there\n<|im_end|>"]


def test_a_token_exact_answer_cut_after_whitespace_alone_trains_its_ids_alone(random_llama):
    """Cut after a first token of whitespace alone ("\\n\\n"), which the template trims before writing its own
    newline: token-exact, the mask is the sampled id, not the template's newline after it."""
    tok = templated(random_llama, TRIMS)
    end = frozenset(tok.convert_tokens_to_ids(["<|im_end|>"]))
    sampled = tok("\n\n", add_special_tokens=False)["input_ids"]
    cut = {"role": "assistant", "content": "\n\n", "token_ids": sampled, "finish_reason": CUT}
    ids, mask = encode_conversation(tok, [ASK, cut], 4096, True, end)
    assert ids[mask].tolist() == sampled


def test_a_token_exact_cut_last_turn_the_template_ends_nothing_after_trains_to_its_last_id(random_llama):
    """Token-exact, cut at its token limit under a template that writes nothing after the answer: the mask
    runs to the last sampled id, the render's last token."""
    tok = templated(random_llama, "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
                                  "{% if add_generation_prompt %}[assistant] {% endif %}")
    sampled = tok("Hello there", add_special_tokens=False)["input_ids"]
    cut = {"role": "assistant", "content": "Hello there", "token_ids": sampled, "finish_reason": CUT}
    ids, mask = encode_conversation(tok, [ASK, cut], 4096, True)
    assert ids[-len(sampled):].tolist() == sampled and ids[mask].tolist() == sampled


def renders(tok, monkeypatch) -> list[int]:
    """The chat template renders made from here on (one entry each)."""
    calls: list[int] = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_dropped_calls_renders_once_for_a_template_without_tool_support(random_llama, monkeypatch):
    """`data prepare` counts dropped calls per conversation: a conversation without calls costs no render,
    and one whose every call the template leaves out (the lab's ChatML) two, not one more per turn."""
    tok = load_tokenizer(random_llama)  # ChatML, without tool support
    chat = [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}, RESULT,
            {"role": "assistant", "content": "Two.", "tool_calls": [CALL, CALL]}, RESULT,
            {"role": "assistant", "content": "2 KiB."}]
    render(tok, chat)  # the template's probe renders, made once per tokenizer
    calls = renders(tok, monkeypatch)
    assert dropped_calls(tok, [ASK, chat[-1]]) == (0, 0) and not calls
    assert dropped_calls(tok, chat) == (2, 2) and len(calls) == 2
