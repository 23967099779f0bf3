"""A tool call's arguments as chat templates take them: most (Qwen's, Llama 3.1's, Hermes) write an
object with `tojson`, as transformers documents and vLLM and SGLang hand it; DeepSeek's concatenate
`arguments` as text, the JSON string the model wrote and the OpenAI API carries. Until 2026-12-03 a
conversation with tool calls under DeepSeek-V3's template was refused ("can only concatenate str
(not "dict") to str"), so it could not be captured at all."""

from __future__ import annotations

import pytest
from data_helpers import write_jsonl
from test_data_chat import masked
from test_data_tools import ANSWER, HERMES, TOOLS, row

from drafter_lab.data.chat import dropped_calls, encode_conversation, render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

# DeepSeek-V3-0324's chat template (DeepSeek-R1's but for cutting thinking), written out by hand from
# its tokenizer_config.json: calls concatenated as ```json blocks, results between output tags. (The
# first V3 release writes calls only for a turn whose content is null.)
DEEPSEEK_V3 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}"
    "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}"
    "{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name']"
    " + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type']"
    " + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n'"
    " + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}"
    "{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n'"
    " + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}"
    "{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"
    "{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"
)
SPECIAL = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
           "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
           "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
EOS = "<｜end▁of▁sentence｜>"


def templated(random_llama, template: str):
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = template
    return tok


def conversation(tmp_path, path: str = "setup.py"):
    """The tool-use conversation as read: the call's arguments (a JSON string in the file) an object."""
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row(path=path)]))
    return conv


def call(path: str) -> str:
    return (f'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>stat\n```json\n{{"path": "{path}"}}\n```'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>")


@pytest.mark.parametrize("path", ["setup.py", "ü.py"])
def test_deepseek_v3_takes_arguments_as_json_text_and_trains_calls_and_answers(random_llama, tmp_path, path):
    tok = templated(random_llama, DEEPSEEK_V3)
    conv = conversation(tmp_path, path)
    assert isinstance(conv.messages[2]["tool_calls"][0]["function"]["arguments"], dict)  # as read
    text = render(tok, conv.messages, tools=conv.tools)
    assert text == (f"You read files.<｜User｜>How big is {path}?<｜Assistant｜>{call(path)}<｜tool▁outputs▁begin｜>"
                    f"<｜tool▁output▁begin｜>2048<｜tool▁output▁end｜><｜tool▁outputs▁end｜>{ANSWER}{EOS}")
    # Every prefix renders alike (a server's prompt for the answer holds the call as text too).
    assert text.startswith(render(tok, conv.messages[:4], True, tools=conv.tools))
    ends = frozenset({tok.convert_tokens_to_ids(EOS)})
    ids, mask = encode_conversation(tok, conv.messages, 10_000, end_ids=ends, tools=conv.tools)
    assert tok.decode(ids) == text
    assert masked(tok, ids, mask) == [call(path), f"{ANSWER}{EOS}"]
    assert dropped_calls(tok, conv.messages, tools=conv.tools) == (1, 0)


def test_templates_that_write_objects_still_get_objects(random_llama, tmp_path):
    """Qwen's (Hermes) `tojson` of a JSON string would write it quoted: it keeps the object, also on a
    tokenizer that rendered DeepSeek's template before."""
    tok = templated(random_llama, DEEPSEEK_V3)
    conv = conversation(tmp_path)
    render(tok, conv.messages, tools=conv.tools)
    tok.chat_template = HERMES
    assert '"arguments": {"path": "setup.py"}}' in render(tok, conv.messages, tools=TOOLS)


def test_a_template_that_cannot_take_either_is_one_line(random_llama, tmp_path):
    """A template concatenating something else than the arguments (here the tools, objects) is refused
    as before, in one line."""
    tok = templated(random_llama, "{{ 'tools: ' + tools[0] }}" + DEEPSEEK_V3)
    conv = conversation(tmp_path)
    with pytest.raises(LabError, match=r'^chat template rejects the conversation: can only concatenate str \(not "dict"\)'):
        render(tok, conv.messages, tools=conv.tools)


def test_arguments_concatenated_first_are_text_too(random_llama, tmp_path):
    """dict + str raises its own TypeError ("unsupported operand type(s) for +")."""
    tok = templated(random_llama, "{% for m in messages %}{% for c in m['tool_calls'] or [] %}"
                                  "{{ c['function']['arguments'] + '\\n' }}{% endfor %}{% endfor %}")
    assert render(tok, conversation(tmp_path).messages) == '{"path": "setup.py"}\n'
