"""Review s63, the loaders: an eval prompt set of user turns alone (MT-bench's shape) is decoded, not refused
as "no conversations to decode"; the tensor-parallel capture loader refuses a target missing a tensor as
load_target does; a drafter config of 2 aux layer ids is refused when read (export passed it, eval refused it);
a target's tokenizer_config.json or generation_config.json that is a JSON list, and a truncated shard, are
named; a feature shard's token id outside the vocab is named when the probe reads it, not an IndexError."""

from __future__ import annotations

import json
import shutil
import socket

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.data.conversations import Conversation, read_conversations
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_tokenizer

MT_BENCH = [  # one-turn and two-turn questions, no answers
    {"question_id": 81, "conversations": [{"role": "user", "content": "Write a travel blog post about Hawaii."}]},
    {"question_id": 82, "conversations": [{"role": "user", "content": "Draft an email to your supervisor."},
                                          {"role": "user", "content": "Take a moment to critique your own answer."}]},
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_decodes_a_prompt_set_of_user_turns_alone(random_llama, tmp_path, capsys):
    """Was "error: ...: no conversations to decode" after "skipped {'no_assistant_turn': 2}"."""
    prompts = _jsonl(tmp_path / "mt_bench.jsonl", MT_BENCH)
    out = tmp_path / "eval.json"
    assert main(["eval", "--ngram", "--target", str(random_llama), "--prompts", str(prompts),
                 "--max-new-tokens", "4", "--json", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["prompts"] == 2
    assert "skipped" not in capsys.readouterr().err


def test_training_data_still_skips_a_conversation_without_an_answer(tmp_path):
    convs, skipped = read_conversations(_jsonl(tmp_path / "c.jsonl", MT_BENCH))
    assert convs == [] and skipped == {"no_assistant_turn": 2}
    convs, skipped = read_conversations(tmp_path / "c.jsonl", prompts=True)
    assert [len(c.messages) for c in convs] == [1, 2] and skipped == {}


def test_the_first_prompt_of_unanswered_turns_is_the_first_question(random_llama, tmp_path):
    """MT-bench's second question follows the answer to its first: rendered together, they made one prompt of
    two user turns in a row (which templates that require alternating roles refuse)."""
    from drafter_lab.spec.eval import render_prompts

    tok = load_tokenizer(random_llama)
    two = Conversation(id="82", messages=MT_BENCH[1]["conversations"])
    one = Conversation(id="82", messages=MT_BENCH[1]["conversations"][:1])
    assert render_prompts(tok, [two]) == render_prompts(tok, [one])
    with pytest.raises(LabError) as e:
        render_prompts(tok, [Conversation(id="s", messages=[{"role": "system", "content": "be brief"}])], tmp_path)
    assert str(e.value) == f"{tmp_path}: conversation s has no user turn"


@pytest.fixture
def target_copy(random_llama, tmp_path):
    return shutil.copytree(random_llama, tmp_path / "target")


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun's environment for one rank, and the process group the tensor-parallel load starts, ended."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_tensor_parallel_capture_refuses_a_target_missing_a_weight(target_copy, one_rank):
    """Was a model whose lost tensor transformers filled with random values: features captured from noise."""
    pytest.importorskip("accelerate", reason="transformers loads tp_plan='auto' only with `accelerate` installed")
    from drafter_lab.data.capture import _load_tp_target

    name = "model.layers.3.mlp.up_proj.weight"
    f = target_copy / "model.safetensors"
    save_file({k: v for k, v in load_file(str(f)).items() if k != name}, str(f), metadata={"format": "pt"})
    with pytest.raises(LabError) as e:
        _load_tp_target(target_copy, torch.float32)
    assert str(e.value) == (f"{target_copy}: the weight files lack {name}, which transformers would fill with random "
                            "values (a partial download, or tensors under other names?)")


@pytest.mark.parametrize("ids", [[2, 4], [1, 2, 4, 5]])
def test_a_drafter_config_of_other_than_three_aux_layers_is_refused_when_read(tmp_path, ids, capsys):
    """Was exported (an fc of 3 x target_hidden columns beside 2 ids), and refused only by eval."""
    from drafter_lab.drafter.checkpoint import save_drafter
    from drafter_lab.drafter.config import DrafterConfig
    from drafter_lab.drafter.model import Eagle3Drafter

    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        draft_vocab_size=16, target_vocab_size=64, target_hidden_size=32, aux_layer_ids=ids)
    drafter = save_drafter(Eagle3Drafter(cfg), tmp_path / "drafter")
    assert main(["export", "--drafter", str(drafter), "--format", "speculators", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: {drafter / 'config.json'}: config's eagle_aux_hidden_state_layer_ids has {len(ids)} ids: an EAGLE-3 "
        "drafter's fc fuses the hidden states of exactly 3 layers (fc.weight is [hidden, 3 x target_hidden_size])\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_a_target_json_file_that_is_a_list_is_named(target_copy, name):
    """Was "cannot load tokenizer: 'list' object has no attribute 'get'" and "cannot load model: 'list' object is
    not a mapping", naming the directory alone."""
    assert (target_copy / name).is_file()
    (target_copy / name).write_text("[1, 2]")
    with pytest.raises(LabError) as e:
        load_target(target_copy)
    assert str(e.value) == f"{target_copy / name}: is a JSON list, not the object transformers reads"


def test_a_tokenizer_config_cut_short_is_named(target_copy):
    """(A generation_config.json that is no JSON transformers passes over, with a warning.)"""
    (target_copy / "tokenizer_config.json").write_text('{"model_max_length": 2')
    with pytest.raises(LabError) as e:
        load_tokenizer(target_copy)
    assert str(e.value).startswith(f"{target_copy / 'tokenizer_config.json'}: not valid JSON (")


def test_a_truncated_target_shard_is_named(random_llama, tmp_path):
    """Was "cannot load model: Error while deserializing header: ...", naming no shard."""
    from transformers import AutoModelForCausalLM

    out = shutil.copytree(random_llama, tmp_path / "sharded", ignore=shutil.ignore_patterns("model.safetensors"))
    AutoModelForCausalLM.from_pretrained(random_llama).save_pretrained(out, max_shard_size="200KB")
    shard = sorted(out.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(LabError) as e:
        load_target(out, tokenizer=False)
    assert str(e.value).startswith(f"{shard}: cannot read safetensors file: ")


def test_a_feature_token_id_outside_the_vocab_is_named_when_read(stdlib_features, tmp_path):
    """The probe reads its val sequences through FeatureSet.read and embeds them: was an IndexError ("index out
    of range in self") in the drafter's embedding."""
    out = shutil.copytree(stdlib_features, tmp_path / "features")
    manifest = Manifest.load(out)
    shard = out / manifest.shards["val"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    bad = manifest.target["vocab_size"] + 7
    t["input_ids"][1] = bad
    save_file(t, str(shard), metadata=meta)
    fs = FeatureSet(out)
    refs = fs.index("val")
    with pytest.raises(LabError) as e:
        fs.read(refs)
    assert str(e.value) == (f"{shard}: token id {bad} of sequence {refs[0].seq_id} outside the target vocab "
                            f"({manifest.target['vocab_size']})")
    assert len(FeatureSet(stdlib_features).sequences("val")) == len(refs)  # ids in the vocab read as before
