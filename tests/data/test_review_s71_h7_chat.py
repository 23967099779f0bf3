"""chat.py behaviours (lines 233-660) that a mutation audit found unpinned: each test here failed under a
mutant of chat.py that the rest of the suite let pass."""

from __future__ import annotations

from test_data_chat import masked
from tokenizers import AddedToken

from drafter_lab.data.chat import encode_conversation, render, special_token_ids
from drafter_lab.targets.hf import load_tokenizer


def test_only_added_tokens_marked_special_count_as_special(random_llama):
    """An added token the tokenizer splits nothing of but does not mark special (a tool tag some
    templates write as text) is no turn closer: counted special, `_closer` ended a turn at it."""
    tok = load_tokenizer(random_llama)
    tok.add_tokens([AddedToken("<end_of_turn>", special=True), AddedToken("<tool_call>", special=False)])
    closer, tag = tok.convert_tokens_to_ids(["<end_of_turn>", "<tool_call>"])
    ids = special_token_ids(tok)
    assert closer in ids and tag not in ids
    assert set(tok.all_special_ids) <= ids


# Closes an answer only once another message follows, with a special token ahead of the end token (the
# last answer ends in a space: its render alone is no prefix of the conversation's).
CLOSED_LATER = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                "{% else %}{{ m['content'] }}{% if loop.last %} {% else %}<|endoftext|><|im_end|>{% endif %}"
                "{% endif %}{% endfor %}")


def test_a_turn_closed_once_another_follows_ends_at_the_targets_end_token(random_llama):
    """A turn bounded by the next message ends at the first token the target stops at, past a special
    token the template writes ahead of it: ended at the first special token, the drafter never learnt
    the end token."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = CLOSED_LATER
    chat = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": "One."},
            {"role": "user", "content": "More."}, {"role": "assistant", "content": "Two."}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert tok.eos_token == "<|im_end|>"
    assert masked(tok, ids, mask)[0] == "One.<|endoftext|><|im_end|>"


# In the manner of DeepSeek-R1's: an answer shows what follows its last `</think>`, the prompt opens the thinking.
R1_MANNER = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% else %}<｜Assistant｜>{{ m['content'].split('</think>')[-1] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)


def test_a_single_exchange_trains_the_thinking_the_template_hides(random_llama):
    """A question and its answer alone (no system turn) is the commonest conversation: skipped as too
    short, its last turn trained without the thinking the target was served."""
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]})
    tok.chat_template = R1_MANNER
    chat = [{"role": "user", "content": "What does os.path.join do?"},
            {"role": "assistant", "content": "It joins path parts.", "reasoning_content": "They ask about join."}]
    end = frozenset({tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")})
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=end)
    assert masked(tok, ids, mask) == ["They ask about join.\n</think>\n\nIt joins path parts.<｜end▁of▁sentence｜>"]


def test_inline_thinking_keeps_the_whitespace_the_target_began_it_with(random_llama):
    """A local regeneration's inline thinking after the prompt's `<think>\\n` is kept as the target wrote
    it, a leading newline too: stripped (as a dataset's stray newline before `<think>` is), the text
    trained on was not the one served."""
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]})
    tok.chat_template = R1_MANNER
    ask = {"role": "user", "content": "What does os.path.join do?"}
    served = "\nThey ask about join.\n</think>\n\nIt joins path parts."
    end = frozenset({tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")})
    ids, _ = encode_conversation(tok, [ask, {"role": "assistant", "content": served}], 4096, end_ids=end)
    assert tok.decode(ids) == render(tok, [ask], True) + served + "<｜end▁of▁sentence｜>"
