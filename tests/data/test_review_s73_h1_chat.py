"""chat.py's turn placement (lines 366-560) where a mutation audit found it unpinned: each test here
failed under a mutant of chat.py that the rest of the suite let pass."""

from __future__ import annotations

import pytest
from test_data_chat import masked

from drafter_lab.data.chat import TemplateRefusal, encode_conversation
from drafter_lab.targets.hf import load_tokenizer

# A user message is written twice (no marker render places it); the last message is marked (`!` after
# a user's, `~` after an answer: no render of the turns before an answer, or up to it, is a prefix of
# the whole); an answer written after its length (the last, or each) is placed by no marker render
# either: its text is looked for.
ECHOED = ("{% for m in messages %}{% if m['role'] == 'user' %}U: {{ m['content'] }} | {{ m['content'] }}"
          "{% if loop.last %}!{% endif %}\n{% else %}A: {% if LENGTH %}({{ m['content'] | length }}){% endif %}"
          "{{ m['content'] }}<|im_end|>\n{% if loop.last %}~{% endif %}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}A: {% endif %}")


@pytest.mark.parametrize("length", ["loop.last", "true"], ids=["earlier-placed-by-marker", "each-looked-for"])
def test_an_answer_looked_for_lies_past_the_text_of_the_turn_before_it(random_llama, length):
    """A turn placed by its marker, or found by its text, has the next one looked for past its text:
    looked for from less far, the last answer ("goodbye") was found inside the first ("Hello and goodbye")."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = ECHOED.replace("LENGTH", length)
    chat = [{"role": "user", "content": "Please greet me warmly today"},
            {"role": "assistant", "content": "Hello and goodbye"},
            {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "goodbye"}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == ["Hello and goodbye<|im_end|>", "goodbye<|im_end|>"]


# The user's text starts the render; its answer is written after its length (no marker render
# places it, nor one of the turns before it with the generation prompt, which marks the last user message).
AT_THE_START = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% if loop.last %}!{% endif %}"
                "\n{% else %}A({{ m['content'] | length }}): {{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}A({% endif %}")


def test_a_message_at_the_start_of_the_render_bounds_where_the_answer_is_looked_for(random_llama):
    """A message whose text begins the render (offset 0) is placed like any other, so the answer is
    looked for past it: not placed, the answer was found in the request that holds it ("Say hi!")."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = AT_THE_START
    chat = [{"role": "user", "content": "Say hi!"}, {"role": "assistant", "content": "hi!"}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == ["hi!<|im_end|>"]


def test_an_answer_at_the_start_of_the_render_is_placed(random_llama):
    """A conversation that opens with an answer (no header before it) has it found at offset 0:
    taken for not found, the conversation was refused."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}U: {{ m['content'] }}\n{% else %}"
                         "{{ m['content'] }} ({{ m['content'] | length }})<|im_end|>\n{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}A: {% endif %}")
    chat = [{"role": "assistant", "content": "Hey"}, {"role": "user", "content": "Hi"}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert masked(tok, ids, mask) == ["Hey (3)<|im_end|>"]


# Leaves the last message open (Kimi-K2-Instruct-0905's manner: `_closing` adds its end token), marks
# the last user message (no render of the turns before an answer is a prefix of the whole), and writes
# an answer after its length where LENGTH holds (no marker render places it: its text is looked for).
OPEN_MARKED = ("{% for m in messages %}{% if m['role'] == 'user' %}U: {{ m['content'] }}{% if loop.last %}!{% endif %}"
               "\n{% else %}A: {% if LENGTH %}({{ m['content'] | length }}){% endif %}{{ m['content'] }}"
               "{% if not loop.last or add_generation_prompt %}<|im_end|>\n{% endif %}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}A: {% endif %}")


def test_an_answer_is_looked_for_right_past_the_message_before_it_in_a_turn_left_open(random_llama):
    """The message before an answer is placed as long as it is, the end token `_closing` adds to the
    render aside: counted twice over, the answer was looked for from inside itself and the
    conversation refused."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = OPEN_MARKED.replace("LENGTH", "true")
    chat = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "The answer is four."}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert tok.decode(ids).endswith("A: (19)The answer is four.<|im_end|>")
    assert masked(tok, ids, mask) == ["The answer is four.<|im_end|>"]


def test_an_empty_message_bounds_where_the_answer_is_looked_for_in_a_turn_left_open(random_llama):
    """An empty message (all its marker's render lacks is the end token `_closing` adds to the render)
    is placed too, so the answer is looked for past it: not placed, the answer was found in the
    request before it that holds its text ("Say: yes")."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = OPEN_MARKED.replace("LENGTH", "true")
    chat = [{"role": "user", "content": "Say: yes"}, {"role": "user", "content": ""},
            {"role": "assistant", "content": "yes"}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert tok.decode(ids).endswith("U: A: (3)yes<|im_end|>")
    assert masked(tok, ids, mask) == ["yes<|im_end|>"]


# Writes the last user message otherwise (upper-cased: no render of the turns before an answer is a
# prefix of the whole, though one with that message's text replaced is), the first at the very start,
# and text of its own ahead of an answer written before its length (no marker render places it).
UPPER_LAST = ("{% for m in messages %}{% if m['role'] == 'user' %}{% if loop.last %}{{ m['content'] | upper }}"
              "{% else %}{{ m['content'] }}{% endif %}{{ '\\n' }}{% else %}A:{{ '\\n' }}[ok] {{ m['content'] }} "
              "[{{ m['content'] | length }}]<|im_end|>{{ '\\n' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}A:{{ '\\n' }}{% endif %}")


def test_a_turn_begins_where_the_prompt_after_the_message_before_it_ends(random_llama):
    """The turn begins past the message before it (at the start of the render, with its own role) and
    the generation prompt after it, so what the template writes ahead of the answer is masked with it:
    that message not placed, or rendered with another's role, the mask began at the answer's text."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = UPPER_LAST
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert tok.decode(ids) == "hi\nA:\n[ok] yes [3]<|im_end|>\n"
    assert masked(tok, ids, mask) == ["[ok] yes [3]<|im_end|>"]


# Writes bare contents, one right after another, and drops the answers before the last message.
DROPS_EARLIER = ("{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}{% continue %}{% endif %}"
                 "{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}A: {% endif %}")


def test_a_dropped_answer_is_not_looked_for_in_the_last_message_after_it(random_llama):
    """A dropped answer is looked for only up to the message after it, the last one too, and where
    that begins right where the one before the answer ends: looked for further, the user's "yes"
    was taken for the answer and masked, where the conversation is to be refused."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = DROPS_EARLIER
    chat = [{"role": "user", "content": "Is it?"}, {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "yes, and then?"}]
    with pytest.raises(TemplateRefusal, match="drops or rewrites assistant turn 1"):
        encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))


def test_an_answer_the_template_writes_nothing_of_masks_nothing(random_llama):
    """An empty answer written as nothing, the next message right where it begins, has an empty
    region: the message that begins there bounds it. Passed over, the user's text after it was
    masked as the answer."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = [{"role": "user", "content": "Is it?"}, {"role": "assistant", "content": ""},
            {"role": "user", "content": "Fine."}]
    ids, mask = encode_conversation(tok, chat, 4096, end_ids=frozenset({tok.eos_token_id}))
    assert tok.decode(ids) == "Is it?Fine." and not mask.any()
