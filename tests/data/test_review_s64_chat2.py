"""Chat template and loss mask behaviours of chat.py that no other test pinned (the rest of a mutation
audit, after test_review_s64_chat.py): each test here failed under a mutant of chat.py that the rest
of the suite let pass."""

from __future__ import annotations

import json

import pytest
from test_data_chat import ANSWERS, MESSAGES, OTHER_CLOSER, masked, spans, word_by_word
from test_data_hidden_thinking import ANSWER, R1_MANNER, SERVED, SPECIAL, THOUGHT, templated
from test_data_reasoning import ASKED, THINKING
from test_data_tools import CALL
from tokenizers import AddedToken

from drafter_lab.data.chat import TemplateRefusal, encode_conversation, render
from drafter_lab.targets.hf import load_tokenizer

ASK = {"role": "user", "content": "Count."}


def test_a_type_error_other_than_text_plus_an_object_is_the_templates_refusal(random_llama):
    """Arguments go to the template as text only where it joins them to text (DeepSeek's): another
    TypeError on a call (here arithmetic on the arguments) is the template's refusal, not a cue to
    render the calls otherwise than a server would hand them."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% for c in m['tool_calls'] or [] %}<tool_call>{{ c['function']['arguments'] * 1 }}</tool_call>"
        "{% endfor %}<|im_end|>\n{% endfor %}")
    chat = [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    with pytest.raises(TemplateRefusal, match="unsupported operand"):
        render(tok, chat)


def test_a_template_indenting_its_arguments_gets_them_as_text(random_llama):
    """`arguments | indent` joins text to the arguments inside jinja (`+=`: dict and str): as DeepSeek's
    concatenation, the arguments go as the JSON text a server hands the template."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% for c in m['tool_calls'] or [] %}<tool_call>{{ c['function']['arguments'] | indent(2) }}</tool_call>"
        "{% endfor %}<|im_end|>\n{% endfor %}")
    text = render(tok, [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}])
    assert f"<tool_call>{json.dumps(CALL['function']['arguments'])}</tool_call>" in text


# In the manner of Llama 2's: a space between the answer and the end token.
SPACED = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
          "{% else %} {{ m['content'] | trim }} <|im_end|>{% endif %}{% endfor %}")


def test_token_exact_a_cut_answer_trains_its_sampled_ids_alone(random_llama):
    """Token-exact, a cut answer's mask ends with its last sampled id: not with the text the template
    writes between the answer and the end token (Llama 2's space), which the target did not write."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = SPACED
    sampled = word_by_word(tok, "It joins")
    turn = {"role": "assistant", "content": "It joins", "token_ids": sampled, "finish_reason": "length"}
    ids, mask = encode_conversation(tok, [ASK, turn], 4096, True, frozenset({tok.eos_token_id}))
    assert [ids[a:b].tolist() for a, b in spans(mask)] == [sampled]


def test_a_cut_answer_the_template_rewrites_trains_all_it_writes_but_the_end_token(random_llama):
    """A cut answer not found as given in the render (the template expands tabs): its mask is the turn
    as written up to its end-of-turn token, which the target did not write; not nothing, nor that token."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | replace('\\t', '    ') }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    turn = {"role": "assistant", "content": "def f():\n\treturn 1", "finish_reason": "length"}
    ids, mask = encode_conversation(tok, [ASK, turn], 4096, False, frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == ["def f():\n    return 1"]


def test_a_cut_answer_whose_thinking_writes_the_closing_tag_trains_up_to_its_cut(random_llama):
    """Inline thinking that writes `</think>` in its text: Qwen3's template shows the answer after the
    last tag, as the mask reads it; read after the first, the cut answer is not found, and its mask
    would end with the thinking's first words."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = THINKING
    turn = {"role": "assistant", "content": "<think>\nThe tag </think> closes it.\n</think>\n\nIt joins",
            "finish_reason": "length"}
    ids, mask = encode_conversation(tok, [*ASKED, turn], 4096, False, frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == ["<think>\nThe tag \n</think>\n\nIt joins"]


def test_an_added_token_marked_special_closes_a_turn(random_llama):
    """A token the tokenizer marks special without naming it in a special-token slot (Llama 3's
    `<|eot_id|>`, Gemma's `<end_of_turn>`) is the turn's closer where the target's stop ids miss it."""
    tok = load_tokenizer(random_llama)
    tok.add_tokens([AddedToken("<end_of_turn>", special=True)])
    assert tok.convert_tokens_to_ids("<end_of_turn>") not in tok.all_special_ids
    tok.chat_template = OTHER_CLOSER.replace("<|endoftext|>", "<end_of_turn>\n")  # no special token last
    ids, mask = encode_conversation(tok, MESSAGES[:-1], 10_000, end_ids=frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == [a + "<end_of_turn>" for a in ANSWERS]


# In the manner of Mistral's (no generation prompt, consecutive answers written back to back), closing
# a message only once another follows (Kimi-K2-Instruct-0905's).
BACK_TO_BACK = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                "{% else %}{{ m['content'] }}{% if not loop.last %}<|im_end|>{% endif %}{% endif %}{% endfor %}")


def test_answers_written_back_to_back_keep_the_end_token_between_them(random_llama):
    """The second answer begins past the first one's end token: the render before it (the first answer
    left open) ends ahead of that token, and a turn begun there would have token-exact leave the token
    out of the ids, the second answer's put in its place."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = BACK_TO_BACK
    end = frozenset({tok.eos_token_id})
    chat = [ASK, {"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."}]
    exact = [dict(m, token_ids=word_by_word(tok, m["content"])) if m["role"] == "assistant" else m for m in chat]
    for given, token_exact in ((chat, False), (exact, True)):
        ids, mask = encode_conversation(tok, given, 4096, token_exact, end)
        assert tok.decode(ids) == "[INST] Count. [/INST]One.<|im_end|>Two."
        assert masked(tok, ids, mask) == ["One.<|im_end|>Two."]


# A trailer after the last turn (Phi-3's `<|endoftext|>`).
TRAILER = "{% if not add_generation_prompt %}<|endoftext|>{% endif %}"


def test_the_last_turn_written_as_served_ends_as_it_does_otherwise(random_llama):
    """Without the target's stop ids, a turn ends at the last special token the template writes for
    it: the last turn written as served (DeepSeek-R1's, its thinking put back) too, as it does where
    it has no thinking to put back."""
    tok = templated(random_llama, R1_MANNER + TRAILER, [*SPECIAL, "<|endoftext|>"])
    for turn, served in (({"content": ANSWER}, ANSWER + "<｜end▁of▁sentence｜>"),
                         ({"content": ANSWER, "reasoning_content": THOUGHT}, SERVED)):
        ids, mask = encode_conversation(tok, [*ASKED, {"role": "assistant", **turn}], 4096)
        assert masked(tok, ids, mask) == [served + "<|endoftext|>"]
