"""Loss masks under real chat templates written out by hand (Llama 3.1's, with its injected system
header and date), on conversations that trip token and character bookkeeping."""

from __future__ import annotations

import pytest
from test_data_chat import spans, word_by_word
from test_data_reasoning import THINKING
from test_data_tools import ANSWER, CALL, HERMES, TOOLS

from drafter_lab.data.chat import encode_conversation, render
from drafter_lab.targets.hf import load_tokenizer

# Llama-3.1-Instruct's template, tool branches left out: a system header (with its date) written
# into every render, content trimmed, turns closed with `<|eot_id|>`.
LLAMA31 = (
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
LLAMA31_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                   "<|end_of_text|>"]
CHATML_END = "<|im_end|>"


@pytest.fixture
def llama31(random_llama):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": LLAMA31_SPECIAL})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    tok.chat_template = LLAMA31
    return tok


def stop_ids(tok) -> frozenset[int]:
    """As generation_config lists them for Llama 3.1, or the tokenizer's eos alone (ChatML)."""
    names = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"] if tok.eos_token == "<|eot_id|>" else [CHATML_END]
    return frozenset(tok.convert_tokens_to_ids(names))


def chat(first: str, second: str) -> list[dict]:
    return [{"role": "system", "content": "You explain chat formats."}, {"role": "user", "content": "How?"},
            {"role": "assistant", "content": first}, {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": second}]


@pytest.mark.parametrize("family", ["chatml", "llama31"])
@pytest.mark.parametrize("last_only", [False, True])
def test_an_answer_writing_the_end_token_literally_trains_whole(random_llama, llama31, family, last_only):
    """A dataset's answer that writes its template's end-of-turn text (as one explaining ChatML does)
    reads as that special token: the mask ran up to it and stopped, leaving the rest of the answer
    and the turn's real end token untrained (in a template's own render of the turn; a turn written
    otherwise later looked past its answer already)."""
    tok = llama31 if family == "llama31" else load_tokenizer(random_llama)
    end = tok.eos_token
    answers = [f"Close it with {end} at the end.", f"Then {end} and the next header."]
    ids, mask = encode_conversation(tok, chat(*answers), 10_000, end_ids=stop_ids(tok), last_only=last_only)
    want = [a + end for a in answers]
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == (want[-1:] if last_only else want)
    # Token-exact, the target's ids as sampled: the same turns.
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m
             for m in chat(*answers)]
    ids, mask = encode_conversation(tok, exact, 10_000, True, stop_ids(tok), last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == (want[-1:] if last_only else want)


@pytest.mark.parametrize("last_only", [False, True])
def test_token_exact_thinking_that_writes_the_end_token_is_spliced_once(random_llama, last_only):
    """Token-exact, a thinking turn's sampled ids stand for all the template wrote up to its end
    token: that was looked for from the turn's start, so the literal `<|im_end|>` in the thinking
    ended it, and the template's text from there on followed the ids again (written twice)."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = THINKING
    asked = [{"role": "user", "content": "How?"}]
    thought, answer = f"They ask what {CHATML_END} does.", "It ends a turn."
    written = f"<think>\n{thought}\n</think>\n\n{answer}"
    sampled = word_by_word(tok, written)
    turn = {"role": "assistant", "content": answer, "reasoning_content": thought, "token_ids": sampled}
    ids, mask = encode_conversation(tok, [*asked, turn], 10_000, True, stop_ids(tok), last_only=last_only)
    prompt = tok(render(tok, asked, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids(CHATML_END)
    assert ids.tolist() == [*prompt, *sampled, end, *tok("\n", add_special_tokens=False)["input_ids"]]
    assert spans(mask) == [(len(prompt), len(prompt) + len(sampled) + 1)]


# Qwen3's manner with tools (HERMES) and its thinking switch: with `enable_thinking` false the
# generation prompt ends in an empty think block that the render of earlier turns does not have.
HERMES_THINKING_OFF = HERMES.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


@pytest.mark.parametrize("token_exact", [False, True])
def test_a_bare_call_after_a_prompt_the_template_writes_otherwise_is_placed(random_llama, token_exact):
    """Qwen3 with its thinking off, an agent trace: an earlier turn that only calls a tool has no text
    to look for where the prompt before it is not a prefix of the render, so `data prepare` stopped
    at the first such conversation ("chat template drops or rewrites assistant turn 2")."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = HERMES_THINKING_OFF
    off = {"enable_thinking": False}
    chat = [{"role": "system", "content": "You read files."}, {"role": "user", "content": "How big is setup.py?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "2048"}, {"role": "assistant", "content": ANSWER}]
    call = '<tool_call>\n{"name": "stat", "arguments": {"path": "setup.py"}}\n</tool_call>'
    assert render(tok, chat[:2], True, off).endswith("<think>\n\n</think>\n\n")
    assert f"<|im_start|>assistant\n{call}" in render(tok, chat, template_kwargs=off, tools=TOOLS)
    if token_exact:
        chat = [dict(m, token_ids=word_by_word(tok, call if "tool_calls" in m else m["content"]))
                if m["role"] == "assistant" else m for m in chat]
    ids, mask = encode_conversation(tok, chat, 10_000, token_exact, stop_ids(tok), off, TOOLS)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [call + CHATML_END, ANSWER + CHATML_END]


# Gemma-3's template (the system prompt joined to the first user turn, content trimmed, the answer
# turn named `model`) and Phi-3's (`<|end|>`, and `<|endoftext|>` after a training render).
GEMMA3 = '{{ bos_token }}{%- if messages[0][\'role\'] == \'system\' -%}{%- set first_user_prefix = messages[0][\'content\'] + \'\\n\\n\' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if (message[\'role\'] == \'user\') != (loop.index0 % 2 == 0) -%}{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{%- endif -%}{%- if (message[\'role\'] == \'assistant\') -%}{%- set role = "model" -%}{%- else -%}{%- set role = message[\'role\'] -%}{%- endif -%}{{ \'<start_of_turn>\' + role + \'\\n\' + (first_user_prefix if loop.first else "") }}{{ message[\'content\'] | trim }}{{ \'<end_of_turn>\\n\' }}{%- endfor -%}{%- if add_generation_prompt -%}{{\'<start_of_turn>model\\n\'}}{%- endif -%}'
PHI3 = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
FAMILIES = {"gemma3": (GEMMA3, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<eos>", "<end_of_turn>"),
            "phi3": (PHI3, ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<|endoftext|>", "<|end|>")}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("answers", [(" It joins.\n", "It splits."), ("", "\nIt splits.\n\n")], ids=["spaced", "empty"])
def test_real_templates_mask_each_answer_and_its_end_token(random_llama, family, last_only, answers):
    """Answers starting with a space or a newline, or empty: each trains its text as the template writes
    it and the end token, whole text or token-exact, every turn or the last."""
    template, special, eos, end = FAMILIES[family]
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.eos_token, tok.chat_template = eos, template
    stops = frozenset(tok.convert_tokens_to_ids([eos, end]))
    written = [a.strip() if family == "gemma3" else a for a in answers]
    want = [w + end for w in written][-1 if last_only else 0:]
    ids, mask = encode_conversation(tok, chat(*answers), 10_000, end_ids=stops, last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == want
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m
             for m in chat(*answers)]
    ids, mask = encode_conversation(tok, exact, 10_000, True, stops, last_only=last_only)
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [a + end for a in answers][-1 if last_only else 0:]
