"""The probe on a next version that added tokens (Mistral 7B v0.1 -> v0.3: 32000 -> 32768): the drafter is
probed as an engine serves it there (d2t alone maps its ids, the target's embedding reads the new ones),
and what cannot be served so is refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drafter_lab.data.capture import prepare_features
from drafter_lab.drafter.checkpoint import read_checkpoint, served_with_vocab
from drafter_lab.errors import LabError
from drafter_lab.experiments.probe import ProbeConfig, probe
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

RECIPE = TrainConfig(draft_vocab_size=64, max_steps=4, epochs=10, batch_size=4, ttt_steps=2, warmup_steps=1,
                     log_every=2, threads=1)
QUICK = ProbeConfig(max_sequences=8, pilot_steps=0, cka_tokens=64, ttt_steps=2)
ADDED = 8


@pytest.fixture(scope="module")
def source(random_llama, features, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab-source") / "source"
    train(RECIPE, random_llama, features, out)
    return out


@pytest.fixture(scope="module")
def grown(random_llama, features, tmp_path_factory):
    """The random Llama with ADDED special tokens, its matrices grown by copies of row 0 (which wins every
    tie, argmax taking the first), and its features of the same conversations."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("grown")
    tok = AutoTokenizer.from_pretrained(str(random_llama))
    tok.add_special_tokens({"additional_special_tokens": [f"<|tool_{i}|>" for i in range(ADDED)]})
    model = AutoModelForCausalLM.from_pretrained(str(random_llama))
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(old + ADDED)
    with torch.no_grad():
        for m in (model.get_input_embeddings(), model.get_output_embeddings()):
            m.weight[old:] = m.weight[0]
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    prepare_features(root / "model", features.parent / "convs.jsonl", root / "features", max_length=64,
                     val_fraction=0.25, batch_size=12)
    return root / "model", root / "features", old


def test_a_drafter_is_probed_on_a_target_that_added_tokens_as_it_is_served(source, grown, random_llama, features):
    """Where the old tokens' rows are the same, the same text reads the same: zero-shot equals the probe
    on the drafter's own target."""
    path, feats, old = grown
    there = probe(source, path, feats, cfg=QUICK)
    home = probe(source, random_llama, features, cfg=QUICK)
    assert there["zero_shot"] == home["zero_shot"]  # losses over the draft vocabulary too, to every digit
    assert there["zero_shot"]["positions"] > 0 and 0 < there["zero_shot"]["loss_0"] < 10
    assert there["vocab"]["drafter_target_vocab_size"] == old and there["target"]["vocab_size"] == old + ADDED
    pilot = probe(source, path, feats, cfg=dataclasses.replace(QUICK, pilot_steps=4), pilot_recipe=RECIPE)["pilot"]
    assert pilot["steps"] == 4 and pilot["curve"]  # the transfer arm remaps into the grown vocabulary


def test_what_a_target_of_another_size_cannot_serve_is_one_line(source, tmp_path):
    ckpt = read_checkpoint(source)
    v = ckpt.config.target_vocab_size
    grown = served_with_vocab(ckpt, v + ADDED)
    assert grown.config.target_vocab_size == v + ADDED and grown.tensors["t2d"].sum() == ckpt.config.draft_vocab_size
    assert torch.equal(grown.tensors["t2d"][:v], ckpt.tensors["t2d"]) and not grown.tensors["t2d"][v:].any()
    top = int((ckpt.tensors["d2t"] + torch.arange(ckpt.config.draft_vocab_size)).max())
    with pytest.raises(LabError, match=f"for a {v}-token target, this one has {top}: its draft tokens name target "
                                       f"ids up to {top}$"):
        served_with_vocab(ckpt, top)
    own = dataclasses.replace(ckpt, config=dataclasses.replace(ckpt.config, target_hidden_size=2 * ckpt.config.hidden_size))
    assert own.config.own_embedding
    with pytest.raises(LabError, match="embeds with its own"):
        served_with_vocab(own, v + ADDED)
    headless = dataclasses.replace(ckpt, tensors={k: t for k, t in ckpt.tensors.items() if k != "lm_head.weight"})
    with pytest.raises(LabError, match="whole vocabulary"):
        served_with_vocab(headless, v + ADDED)
    assert served_with_vocab(ckpt, v) is ckpt


def test_the_cli_says_the_two_vocab_sizes(source, grown, capsys, monkeypatch):
    from drafter_lab.cli import main

    path, feats, old = grown
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["probe", "--drafter", str(source), "--target", str(path), "--data", str(feats), "--pilot-steps", "0",
                 "--ttt-steps", "2", "--max-sequences", "8", "--threads", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "target vocab size" in line)
    assert "the drafter's / this one" in row and f"{old} / {old + ADDED}" in row


def test_eval_serves_it_there_when_asked_and_decodes_losslessly(source, grown):
    from drafter_lab.spec.engine import SpecConfig, SpecEngine
    from drafter_lab.spec.pairing import load_for_target
    from drafter_lab.targets.hf import load_target

    path, _, old = grown
    target = load_target(path)
    with pytest.raises(LabError, match=f"trained for a {old}-token vocab, the target has {old + ADDED} tokens; pass "
                                       "--allow-other-target"):
        load_for_target(source, target)
    drafter = load_for_target(source, target, allow_other_target=True)
    assert drafter.t2d.numel() == old + ADDED
    prompt = target.tokenizer.apply_chat_template([{"role": "user", "content": "tell me"}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    engine = SpecEngine(target, drafter, SpecConfig(max_new_tokens=10, stop_at_eos=False, steps=3, topk=1))
    assert engine.generate([prompt]).tokens == engine.generate([prompt], speculative=False).tokens
