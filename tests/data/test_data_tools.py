"""Tool use: conversations with `tools`, assistant `tool_calls` and `tool` results read in the shape
servers hand chat templates, render with their tools, and train on the calls but not on the
results; regeneration, local or through a server, keeps a turn of calls as recorded (the results
answer those calls) and writes the answers after the results anew."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from data_helpers import run_cli, write_jsonl
from test_data_chat import masked, spans
from test_data_regenerate_server import requests, serving

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data import regenerate_server
from drafter_lab.data.capture import prepare_features, sampled_at
from drafter_lab.data.chat import dropped_calls, encode_conversation, render
from drafter_lab.data.conversations import content_id, read_conversations, write_conversations
from drafter_lab.data.regenerate import generate_texts, generation_config, regenerate
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.spec.eval import render_prompts
from drafter_lab.targets.hf import load_target, load_tokenizer

# In the manner of Qwen3's (Hermes) template: tools listed in the system turn, thinking in a <think>
# block and calls in <tool_call> tags inside the assistant turn, results as a user turn in
# <tool_response> tags.
HERMES = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if m['reasoning_content'] %}<think>\n{{ m['reasoning_content'] }}\n</think>\n{% endif %}{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}{% if m['content'] or not loop.first %}\n{% endif %}"
    "<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "stat", "description": "A file's size in bytes",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "stat", "arguments": {"path": "setup.py"}}}
ANSWER = "It is 2 KB."


def row(cid: str = "tools-0", path: str = "setup.py", thought: str | None = None) -> dict:
    """A conversation as the OpenAI API writes one: tools as a JSON string (as some datasets store
    them), a call with its arguments as a JSON string and no content (with the thinking before it),
    its result."""
    call = {**CALL, "function": {"name": "stat", "arguments": json.dumps({"path": path})}}
    return {"id": cid, "tools": json.dumps(TOOLS), "messages": [
        {"role": "system", "content": "You read files."}, {"role": "user", "content": f"How big is {path}?"},
        {"role": "assistant", "content": None, "tool_calls": [call], **({"reasoning_content": thought} if thought else {})},
        {"role": "tool", "tool_call_id": "c1", "content": "2048"}, {"role": "assistant", "content": ANSWER}]}


@pytest.fixture(scope="module")
def hermes_llama(random_llama, tmp_path_factory):
    """The random Llama with a tool-using chat template saved in its tokenizer files."""
    out = tmp_path_factory.mktemp("hermes") / "model"
    shutil.copytree(random_llama, out)
    tok = load_tokenizer(out)
    tok.chat_template = HERMES
    tok.save_pretrained(out)
    return out


@pytest.fixture
def hermes(hermes_llama):
    return load_tokenizer(hermes_llama)


def ends(tok) -> frozenset[int]:
    return frozenset({tok.convert_tokens_to_ids("<|im_end|>")})


def test_tool_use_reads_in_the_shape_servers_hand_templates(tmp_path):
    one = {"from": "function_call", "value": json.dumps({"name": "stat", "arguments": {"path": "a.py"}})}
    both = [{"name": "stat", "arguments": {"path": "a.py"}}, {"name": "stat", "arguments": {"path": "b.py"}}]
    sharegpt = {"conversations": [{"from": "human", "value": "Sizes of a.py and b.py?"},
                                  {"from": "function_call", "value": json.dumps(both)},
                                  {"from": "observation", "value": "12"}, {"from": "observation", "value": "13"},
                                  {"from": "gpt", "value": "12 and 13 bytes."}]}
    rows = [row(), sharegpt, {"messages": [{"role": "user", "content": "Size of a.py?"}, one,
                                           {"role": "ipython", "content": "12"}, {"role": "assistant", "content": "12."}]}]
    (conv, parallel, llama), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    assert conv.tools == TOOLS
    assert conv.messages[2] == {"role": "assistant", "content": "", "tool_calls": [CALL]}  # arguments parsed
    assert conv.messages[3] == {"role": "tool", "content": "2048", "tool_call_id": "c1"}
    assert parallel.tools is None and llama.tools is None
    assert parallel.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": c} for c in both]}
    assert [m["role"] for m in parallel.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert llama.messages[1]["tool_calls"] == [{"type": "function", "function": both[0]}]
    assert llama.messages[2] == {"role": "tool", "content": "12"}
    write_conversations(tmp_path / "again.jsonl", [conv, parallel, llama])
    assert read_conversations(tmp_path / "again.jsonl")[0] == [conv, parallel, llama]


def test_a_result_stored_as_a_json_value_reads_as_its_json_text(tmp_path):
    """Some datasets keep a tool's result as an object: it reads as the JSON text a client sends
    (and its content id with it); a user turn's object is refused as before."""
    result = {"size": 2048, "unit": "bytes", "path": "ü.py"}
    data = row()
    data["messages"][3] = {**data["messages"][3], "content": result}
    as_text = row()
    as_text["messages"][3] = {**as_text["messages"][3], "content": json.dumps(result, ensure_ascii=False)}
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [{**data, "id": None}]))
    (same,), _ = read_conversations(write_jsonl(tmp_path / "t.jsonl", [{**as_text, "id": None}]))
    assert conv.messages[3]["content"] == '{"size": 2048, "unit": "bytes", "path": "ü.py"}' and conv.id == same.id
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": result}]}])
    with pytest.raises(LabError, match="line 1: turn content is dict, not text"):
        read_conversations(bad, strict=True)


def test_content_ids_take_calls_and_tools_and_stay_put_without(tmp_path):
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [{**row(), "id": None}]))
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "A greeting."}]
    before = json.dumps([["user", "Hi"], ["assistant", "Hello", "A greeting."]], ensure_ascii=False)  # the ids of 2026-12-01
    assert content_id(plain) == "sha256:" + hashlib.sha256(before.encode()).hexdigest()[:16]
    assert conv.id == content_id(conv.messages, TOOLS)
    other_call = [*conv.messages[:2], {**conv.messages[2], "tool_calls": [{**CALL, "function": {"name": "ls", "arguments": {}}}]},
                  *conv.messages[3:]]
    assert len({conv.id, content_id(conv.messages), content_id(other_call, TOOLS)}) == 3


@pytest.mark.parametrize("turn, tools, says", [
    ({"role": "user", "content": "x", "tool_calls": [CALL]}, None, "tool_calls must be a list, on an assistant turn"),
    ({"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}, None, "a tool call needs a name"),
    ({"role": "assistant", "content": "", "tool_calls": [{"name": "stat", "arguments": "{path"}]}, None,
     "a tool call needs a name and arguments"),
    ({"from": "function_call", "value": "stat(a.py)"}, None, "a tool call needs a name and arguments"),
    ({"role": "assistant", "content": "x"}, "[not json", "tools must be a list of objects"),
    ({"role": "assistant", "content": "x"}, {"name": "stat"}, "tools must be a list of objects"),
], ids=["calls-on-a-user-turn", "no-name", "arguments-not-json", "sharegpt-call-not-json", "tools-not-json",
        "tools-not-a-list"])
def test_bad_tool_use_is_one_line_naming_file_and_line(tmp_path, turn, tools, says):
    path = write_jsonl(tmp_path / "c.jsonl", [row(), {"messages": [{"role": "user", "content": "q"}, turn],
                                                      **({"tools": tools} if tools is not None else {})}])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert "line 2" in str(e.value) and says in str(e.value) and str(path) in str(e.value)


def test_calls_train_and_results_and_tools_do_not(hermes, tmp_path):
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row()]))
    text = render(hermes, conv.messages, tools=conv.tools)
    assert '"name": "stat", "description"' in text and "<tool_response>\n2048\n</tool_response>" in text
    for tags in ("text", "control tokens"):  # Qwen's tags are text; Mistral's [TOOL_CALLS] is a control token
        if tags == "control tokens":
            hermes.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
        ids, mask = encode_conversation(hermes, conv.messages, 10_000, end_ids=ends(hermes), tools=conv.tools)
        assert masked(hermes, ids, mask) == [
            '<tool_call>\n{"name": "stat", "arguments": {"path": "setup.py"}}\n</tool_call><|im_end|>', f"{ANSWER}<|im_end|>"]
    # A served evaluation's prompt lists the tools too.
    assert render_prompts(hermes, [conv]) == [hermes(render(hermes, conv.messages[:2], True, tools=TOOLS),
                                                      add_special_tokens=False)["input_ids"]]


def test_a_bare_call_in_a_template_not_prefix_stable_is_placed_after_the_message_before_it(hermes, tmp_path):
    """No text of its own to look for: the call starts past the user turn and the generation prompt
    (until 2026-12-02 it was refused; before that, placed at the cursor: a mask from the turn before)."""
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row()]))
    hermes.chat_template = "{{ messages | length }} turns\n" + HERMES  # no render is a prefix of a longer one
    ids, mask = encode_conversation(hermes, conv.messages, 10_000, end_ids=ends(hermes), tools=conv.tools)
    assert masked(hermes, ids, mask) == [
        '<tool_call>\n{"name": "stat", "arguments": {"path": "setup.py"}}\n</tool_call><|im_end|>', f"{ANSWER}<|im_end|>"]


def test_token_exact_trains_the_targets_tokens_only(hermes, tmp_path):
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row()]))
    answer = hermes(ANSWER, add_special_tokens=False)["input_ids"]
    conv.messages[4]["token_ids"] = [*answer, *ends(hermes)]
    ids, mask = encode_conversation(hermes, conv.messages, 10_000, True, ends(hermes), tools=conv.tools)
    assert masked(hermes, ids, mask) == [f"{ANSWER}<|im_end|>"]  # the recorded call is the dataset's, not the target's
    text, _ = encode_conversation(hermes, conv.messages, 10_000, tools=conv.tools)
    assert ids.tolist() == text.tolist()
    # A call the target sampled (a server's tool parser split it out): its ids are the whole turn.
    sampled = hermes('<tool_call>\n{"name": "stat", "arguments": {"path": "setup.py"}}\n</tool_call>',
                     add_special_tokens=False)["input_ids"][::-1]  # not what the text tokenizes to
    conv.messages[2]["token_ids"] = sampled
    ids, mask = encode_conversation(hermes, conv.messages, 10_000, True, ends(hermes), tools=conv.tools)
    first = spans(mask)[0]
    assert ids[first[0]:first[1]].tolist() == [*sampled, *ends(hermes)]
    del conv.messages[4]["token_ids"]
    with pytest.raises(LabError, match="assistant turn 4 has no token_ids"):  # an answer still needs the target's
        encode_conversation(hermes, conv.messages, 10_000, True, ends(hermes), tools=conv.tools)


def test_local_regeneration_keeps_calls_and_answers_after_their_results(hermes_llama, tmp_path, monkeypatch):
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row(), row("tools-1", "noxfile.py")]))
    target = load_target(hermes_llama)
    prompts = []
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda t, p, g: prompts.extend(p) or generate_texts(t, p, g))
    out = regenerate(target, convs, max_new_tokens=6, show_progress=False)
    # One prompt each (the answer after the result), with the tools and the result.
    assert sorted(prompts) == sorted(render(target.tokenizer, c.messages[:4], True, tools=TOOLS) for c in convs)
    for before, after in zip(convs, out):
        assert after.tools == before.tools and after.messages[:4] == before.messages[:4]  # the call as recorded
        prompt = render(target.tokenizer, before.messages[:4], True, tools=TOOLS)
        ((text, ids),) = generate_texts(target, [prompt], generation_config(target, 0.0, 6))
        assert (after.messages[4]["content"], after.messages[4]["token_ids"]) == (text, ids)
    # Captured token for token, the answers say how they were sampled: the calls kept as recorded were not.
    write_conversations(tmp_path / "r.jsonl", out)
    manifest = prepare_features(hermes_llama, tmp_path / "r.jsonl", tmp_path / "feat", token_exact=True, val_fraction=0.0)
    assert sampled_at(manifest.source) == 0.0


def test_server_regeneration_sends_tools_and_calls_and_resumes(hermes_llama, tmp_path, monkeypatch):
    convs = write_jsonl(tmp_path / "c.jsonl", [row(thought="Stat it."), row("tools-1", "noxfile.py")])
    gen = ("--max-new-tokens", "6", "--seed", "0")
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", hermes_llama, *gen) == 0
    with serving(hermes_llama, tmp_path) as (url, log):
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                       "--server", url, *gen) == 0
        sent = requests(log)
        # Killed once every answer is in its journal, before the file is written: the journal keeps the tools.
        with monkeypatch.context() as m:
            m.setattr(regenerate_server, "write_conversations", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
            assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "resumed.jsonl",
                           "--server", url, *gen) == 130
        log.unlink()
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "resumed.jsonl",
                       "--server", url, *gen) == 0
        assert not log.exists()  # nothing asked again
    lines = (tmp_path / "served.jsonl").read_text().splitlines(keepends=True)
    assert (tmp_path / "resumed.jsonl").read_text() == "".join(lines)
    assert len(sent) == 2  # one answer each: the calls are not asked again
    for r in sent:
        path = r["messages"][1]["content"].removeprefix("How big is ").removesuffix("?")
        assert r["tools"] == TOOLS
        thought = {"reasoning_content": "Stat it."} if path == "setup.py" else {}  # as interleaved thinking sends it
        assert r["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [  # as the OpenAI API has it
            {**CALL, "function": {"name": "stat", "arguments": json.dumps({"path": path})}}], **thought}
        assert r["messages"][3] == {"role": "tool", "content": "2048", "tool_call_id": "c1"}
    local = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    served = [json.loads(line) for line in lines]
    end = sorted(ends(load_tokenizer(hermes_llama)))
    answers = []
    for a, b in zip(local, served):
        assert a["tools"] == b["tools"] == TOOLS and a["conversations"][:4] == b["conversations"][:4]
        mine, theirs = a["conversations"][4], b["conversations"][4]
        assert theirs["token_ids"] in (mine["token_ids"], mine["token_ids"] + end)  # the end token it stopped at
        assert theirs["finish_reason"] == mine["finish_reason"]
        answers.append(mine["token_ids"] + end * (mine["finish_reason"] == "stop"))  # none trains after a cut one
    # Captured token for token: the target's answers train, the recorded calls do not.
    assert run_cli("data", "prepare", "--target", hermes_llama, "--conversations", tmp_path / "served.jsonl",
                   "--out", tmp_path / "feat", "--val-fraction", "0", "--token-exact") == 0
    seqs = list(FeatureSet(tmp_path / "feat").sequences("train"))
    assert sorted(seq.input_ids[seq.loss_mask].tolist() for seq in seqs) == sorted(answers)
    tok = load_tokenizer(hermes_llama)
    assert all('{"name": "stat", "description"' in tok.decode(seq.input_ids) for seq in seqs)  # rendered with the tools


@pytest.mark.parametrize("calls, says", [
    ([{"id": "c9", "type": "function", "function": {"name": "stat", "arguments": '{"path": "a.py"}'}}], None),
    ({"name": "stat"}, "tool_calls is not a list"),
    ([{"type": "function", "function": {"name": "stat", "arguments": "{a.py"}}], "a tool call needs a name and arguments"),
], ids=["parsed", "not-a-list", "arguments-not-json"])
def test_calls_a_servers_tool_parser_found_are_kept(monkeypatch, calls, says):
    answer = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}, "token_ids": [5, 6]}]}
    monkeypatch.setattr(regenerate_server, "request_json", lambda *a, **k: answer)
    cfg = regenerate_server.ServerConfig(url="http://127.0.0.1:1", model="m")
    if says is None:
        assert regenerate_server.ask(cfg, [{"role": "user", "content": "q"}], TOOLS, 0) == (
            {"content": "", "tool_calls": [{"id": "c9", "type": "function",
                                             "function": {"name": "stat", "arguments": {"path": "a.py"}}}]}, [5, 6])
        return
    with pytest.raises(LabError, match=says) as e:
        regenerate_server.ask(cfg, [{"role": "user", "content": "q"}], TOOLS, 0)
    assert "http://127.0.0.1:1/v1/chat/completions" in str(e.value)


def test_a_template_without_tool_support_is_noted(random_llama, hermes_llama, tmp_path, capsys):
    convs = write_jsonl(tmp_path / "c.jsonl", [row(), row("tools-1", "noxfile.py")])
    for model, noted in ((hermes_llama, False), (random_llama, True)):  # the random Llama's is the lab's ChatML
        assert run_cli("data", "prepare", "--target", model, "--conversations", convs, "--out", tmp_path / f"{noted}",
                       "--val-fraction", "0") == 0
        err = " ".join(capsys.readouterr().err.split())
        assert ("the chat template leaves out tool calls of 2 of 2 assistant turns that make them" in err) == noted
    assert dropped_calls(load_tokenizer(random_llama), read_conversations(convs)[0][0].messages) == (1, 1)
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "p.jsonl", [row()]))
    parallel = [*conv.messages[:2], {**conv.messages[2], "tool_calls": [CALL, {**CALL, "id": "c2"}]}, *conv.messages[3:]]
    assert dropped_calls(load_tokenizer(hermes_llama), parallel, tools=conv.tools) == (1, 0)  # writes both
