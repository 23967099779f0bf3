"""Chat template variables (`--chat-template-kwargs`, an SGLang or vLLM request's `chat_template_kwargs`):
a hybrid thinking model served with `{"enable_thinking": false}` has an empty think block closing its
prompt. The regeneration's prompts, the server's requests, the captured sequences and their masks,
and the eval's prompts all see them, and a capture made with other ones does not resume."""

from __future__ import annotations

import dataclasses
import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_chat import spans
from test_data_reasoning import ANSWER, ASKED, THINKING, thinking_tokenizer
from test_data_regenerate_server import requests, serving

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.capture import CaptureConfig, tokenize_conversations
from drafter_lab.data.chat import dropped_reasoning, encode_conversation, render
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.regenerate import regenerate, regeneration_settings
from drafter_lab.data.regenerate_server import ServerConfig, _settings
from drafter_lab.data.shards import FeatureSet
from drafter_lab.spec.eval import render_prompts
from drafter_lab.targets.hf import load_target, load_tokenizer

OFF = {"enable_thinking": False}
EMPTY_THINK = "<think>\n\n</think>\n\n"
GEN = ("--max-new-tokens", "5", "--seed", "0")


@pytest.fixture(scope="module")
def hybrid_llama(random_llama, tmp_path_factory):
    """The random Llama saved with the Qwen3-like thinking template (its own chat template file)."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("hybrid") / "model"
    LlamaForCausalLM.from_pretrained(random_llama).save_pretrained(out)
    tok = thinking_tokenizer(random_llama)
    tok.save_pretrained(out)
    assert load_tokenizer(out).chat_template == THINKING
    return out


def test_thinking_off_moves_the_empty_think_block_into_the_prompt(random_llama):
    tok = thinking_tokenizer(random_llama)
    chat = [*ASKED, {"role": "assistant", "content": ANSWER}]
    assert render(tok, ASKED, True, OFF).endswith(f"assistant\n{EMPTY_THINK}")
    assert render(tok, ASKED, True) == render(tok, ASKED, True, OFF).removesuffix(EMPTY_THINK)
    on_ids, on_mask = encode_conversation(tok, chat, max_length=10_000)
    off_ids, off_mask = encode_conversation(tok, chat, max_length=10_000, template_kwargs=OFF)
    # One sequence either way (the last turn shows an empty think block); served with the thinking off,
    # the block is the prompt's and the target samples the answer alone.
    assert off_ids.tolist() == on_ids.tolist()
    assert [tok.decode(off_ids[a:b]) for a, b in spans(on_mask)] == [f"{EMPTY_THINK}{ANSWER}<|im_end|>"]
    assert [tok.decode(off_ids[a:b]) for a, b in spans(off_mask)] == [f"{ANSWER}<|im_end|>"]


def test_every_render_of_a_capture_sees_them(random_llama):
    """Llama 3's template reads `date_string` in its system header, outside any generation prompt: the
    text, each turn's prompt and each turn's own render all take it, so the turn's end is its own
    and the mask runs past the think tokens a tokenizer marks special to the end of the turn."""
    tok = thinking_tokenizer(random_llama)
    tok.chat_template = "{% if date_string is defined %}Today is {{ date_string }}.\n{% endif %}" + THINKING
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": "Look it up."}]
    ids, mask = encode_conversation(tok, chat, max_length=10_000, template_kwargs={"date_string": "2 Dec 2026"})
    assert tok.decode(ids).startswith("Today is 2 Dec 2026.\n")
    assert [tok.decode(ids[a:b]) for a, b in spans(mask)] == [f"<think>\nLook it up.\n</think>\n\n{ANSWER}<|im_end|>"]


def test_reasoning_a_variable_shows_is_not_counted_as_left_out(random_llama, capsys):
    target = load_target(random_llama)
    tok = target.tokenizer
    tok.chat_template = "{% if show_thinking %}" + THINKING + "{% else %}" + tok.chat_template + "{% endif %}"
    chat = [*ASKED, {"role": "assistant", "content": ANSWER, "reasoning_content": "Look it up."}]
    assert dropped_reasoning(tok, chat) == (1, 1)
    assert dropped_reasoning(tok, chat, {"show_thinking": True}) == (1, 0)
    for kwargs, said in ((None, True), ({"show_thinking": True}, False)):
        capsys.readouterr()
        tokenize_conversations(target, [Conversation("c", chat)], CaptureConfig(chat_template_kwargs=kwargs), "c.jsonl",
                               {}, main=True)
        assert ("leaves out the reasoning of 1 of 1" in " ".join(capsys.readouterr().err.split())) is said


def test_a_local_regeneration_prompts_with_the_variables(random_llama, monkeypatch):
    target = load_target(random_llama)
    target.tokenizer.chat_template = THINKING
    prompts = []

    def generate(target, batch, gen_config):
        prompts.extend(batch)
        return [("ok", [7]) for _ in batch]

    monkeypatch.setattr(regenerate_module, "generate_texts", generate)
    convs = [Conversation("c", [*ASKED, {"role": "assistant", "content": ANSWER}])]
    regenerate(target, convs, show_progress=False)
    regenerate(target, convs, template_kwargs=OFF, show_progress=False)
    assert prompts == [render(target.tokenizer, ASKED, True), render(target.tokenizer, ASKED, True, OFF)]
    assert prompts[1].endswith(EMPTY_THINK) and not prompts[0].endswith(EMPTY_THINK)


def test_the_server_is_sent_them_and_answers_as_the_local_regeneration(hybrid_llama, tmp_path):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    kwargs = ("--chat-template-kwargs", json.dumps(OFF))
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", hybrid_llama, "--batch-size", "1", *GEN, *kwargs) == 0
    with serving(hybrid_llama, tmp_path) as (url, log):
        assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "served.jsonl",
                       "--server", url, *GEN, *kwargs) == 0
    local, served = (read_conversations(tmp_path / f"{n}.jsonl")[0] for n in ("local", "served"))
    for mine, theirs in zip(local, served, strict=True):
        assert [m["content"] for m in mine.messages] == [m["content"] for m in theirs.messages]
    assert len(requests(log)) == 6 and all(r["chat_template_kwargs"] == OFF for r in requests(log))


def test_a_capture_records_them_and_refuses_to_resume_with_others(hybrid_llama, tmp_path, capsys):
    convs = write_jsonl(tmp_path / "c.jsonl", [dict(r, conversations=r["conversations"][:-2])
                                               for r in make_conversations(4)])
    out = tmp_path / "feat"
    base = ("data", "prepare", "--target", hybrid_llama, "--conversations", convs, "--out", out,
            "--val-fraction", "0", "--regenerate", *GEN)
    assert run_cli(*base, "--chat-template-kwargs", json.dumps(OFF)) == 0
    # Its regeneration prompted as `data regenerate` does with them.
    assert run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "local.jsonl",
                   "--target", hybrid_llama, *GEN, "--chat-template-kwargs", json.dumps(OFF)) == 0
    (cache,) = out.glob("regenerated-*.jsonl")
    assert read_conversations(cache)[0] == read_conversations(tmp_path / "local.jsonl")[0]
    features = FeatureSet(out)
    assert features.manifest.source["chat_template_kwargs"] == OFF
    tok = load_tokenizer(hybrid_llama)
    seqs = features.sequences("train")
    assert len(seqs) == 4
    for seq in seqs:
        (a, b), = spans(seq.loss_mask)
        assert tok.decode(seq.input_ids[:a]).endswith(EMPTY_THINK) and EMPTY_THINK not in tok.decode(seq.input_ids[a:b])
    capsys.readouterr()
    assert run_cli(*base) == 2  # the same --out without them: other sequences
    assert "chat_template_kwargs: {'enable_thinking': False} there, None now" in capsys.readouterr().err


def test_journals_name_them_and_runs_without_keep_their_settings(random_llama, tmp_path):
    """A killed regeneration resumes only with the variables it ran with; one without any has the
    settings it had before they existed."""
    source = write_jsonl(tmp_path / "c.jsonl", make_conversations(1))
    served = ServerConfig(url="http://127.0.0.1:1", model="m")
    assert "chat_template_kwargs" not in _settings(served, source)
    assert _settings(dataclasses.replace(served, chat_template_kwargs=OFF), source)["chat_template_kwargs"] == OFF
    target, gen = load_target(random_llama), dict(temperature=0.0, max_new_tokens=4, batch_size=1, seed=0)
    assert "chat_template_kwargs" not in regeneration_settings(target, source, **gen)
    assert regeneration_settings(target, source, **gen, template_kwargs=OFF)["chat_template_kwargs"] == OFF


@pytest.mark.parametrize("text, says", [("[1]", "expected a JSON object"), ("{nope", "expected a JSON object"),
                                        ('{"tokenize": true}', "tokenize: apply_chat_template's own argument")])
def test_bad_variables_are_one_line(text, says, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli("data", "prepare", "--target", "t", "--conversations", "c", "--out", "o", "--chat-template-kwargs", text)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_offline_training_refuses_them(tmp_path, capsys):
    assert run_cli("train", "--target", tmp_path, "--data", tmp_path, "--out", tmp_path / "d",
                   "--chat-template-kwargs", json.dumps(OFF)) == 2
    assert "error: --chat-template-kwargs applies to --conversations (online) runs only" in capsys.readouterr().err


def test_the_eval_renders_its_prompts_with_them(random_llama):
    tok = thinking_tokenizer(random_llama)
    convs = [Conversation("c", [*ASKED, {"role": "assistant", "content": ANSWER}])]
    on, off = render_prompts(tok, convs), render_prompts(tok, convs, template_kwargs=OFF)
    assert tok.decode(off[0]) == tok.decode(on[0]) + EMPTY_THINK
