"""Review (s75, h5): placing the turns takes the template's own render of the whole conversation (where
the last turn ends, `_span`; the earlier turns' text where the last turn thinks, `_unserved`), which
`served_text` has made already: it comes along with the served text, so a conversation encoded as `data
prepare` encodes it (`served_text`, then `encode_conversation` given that text) is rendered whole once,
not two or three times, to the same ids and mask."""

from __future__ import annotations

import pytest
from test_data_hidden_thinking import ASKED, R1_MANNER, templated
from test_data_reasoning import THINKING

from drafter_lab.data import chat

THOUGHT = [*ASKED, {"role": "assistant", "content": "It joins.", "reasoning_content": "Short."},
           {"role": "user", "content": "And split?"},
           {"role": "assistant", "content": "It splits.", "reasoning_content": "Think more."}]
PLAIN = [*ASKED, {"role": "assistant", "content": "It joins."}, {"role": "user", "content": "And split?"},
         {"role": "assistant", "content": "It splits."}]


@pytest.mark.parametrize("last_only", [False, True], ids=["all", "last"])
@pytest.mark.parametrize("messages", [THOUGHT, PLAIN], ids=["thinking", "plain"])
@pytest.mark.parametrize("template", [R1_MANNER, THINKING], ids=["deepseek-r1", "qwen3"])
def test_a_conversation_is_rendered_whole_once(random_llama, template, messages, last_only, monkeypatch):
    tok = templated(random_llama, template)
    want = [t.tolist() for t in chat.encode_conversation(tok, messages, 10_000, last_only=last_only)]
    whole = []
    render = chat.render

    def counted(tokenizer, rendered, add_generation_prompt=False, *args):
        whole.append(rendered == messages and not add_generation_prompt)
        return render(tokenizer, rendered, add_generation_prompt, *args)

    monkeypatch.setattr(chat, "render", counted)
    text = chat.served_text(tok, messages, frozenset(), None, None)
    assert [t.tolist() for t in chat.encode_conversation(tok, messages, 10_000, text=text, last_only=last_only)] == want
    assert sum(whole) == 1
