"""Probe review: bad pairings are one line, a drafter without recorded aux layers is probed at home,
--val-data naming --data is refused before the signals, a CKA prints on the side of its line; a next
version that added tokens (Mistral 7B v0.1 -> v0.3: 32000 -> 32768) is probed with the drafter as an
engine serves it there (d2t alone maps its ids, the target's embedding reads the new ones), and what
cannot be served so is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from drafter_lab.data.capture import prepare_features
from drafter_lab.drafter.checkpoint import read_checkpoint, served_with_vocab
from drafter_lab.errors import LabError
from drafter_lab.experiments import probe as probe_mod
from drafter_lab.experiments.probe import ProbeConfig, ProbeThresholds, decide, probe
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

RECIPE = TrainConfig(draft_vocab_size=64, max_steps=4, epochs=10, batch_size=4, ttt_steps=2, warmup_steps=1,
                     log_every=2, threads=1)
QUICK = ProbeConfig(max_sequences=4, pilot_steps=0, cka_tokens=64, ttt_steps=2)


@pytest.fixture(scope="module")
def wide_source(wide_llama, features, tmp_path_factory):
    """A drafter of a target 256 wide (the random Llama is 64): its fc takes 3 x 256."""
    root = tmp_path_factory.mktemp("wide-source")
    prepare_features(wide_llama, features.parent / "convs.jsonl", root / "features", max_length=64,
                     val_fraction=0.25, batch_size=12)
    train(RECIPE, wide_llama, root / "features", root / "source")
    return root / "source"


def _shallow(random_llama, out):
    """The random Llama's tokenizer on a 4-layer model: aux layers 4 and 5 are past its end."""
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = AutoConfig.from_pretrained(str(random_llama))
    cfg.num_hidden_layers = 4
    LlamaForCausalLM(cfg).save_pretrained(out)
    for f in random_llama.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    return out


def test_a_drafter_of_another_targets_width_is_one_line(wide_source, random_llama, features):
    """Its fc would meet the features in a matmul: a traceback, not the probe's answer."""
    with pytest.raises(LabError, match=r"hidden size does not fit the target: fc takes 3 x 256, the target's "
                                       r"hidden states are 64 wide") as e:
        probe(wide_source, random_llama, features, cfg=QUICK)
    assert str(wide_source) in str(e.value)


def _unrecorded(source, out):
    """The drafter without its run record (an imported release): no fingerprint tells its target, so
    the --source-target given is taken as it is, and checked by shape."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("run.json"))
    return out


def test_a_source_target_of_another_width_is_one_line(source, features, random_llama, wide_llama, tmp_path):
    """The home run would fail in a forward pass (fc), as it would with too few layers (below)."""
    with pytest.raises(LabError, match=r"hidden size does not fit.*\(--source-target .*\)$"):
        probe(_unrecorded(source, tmp_path / "imported"), random_llama, features, wide_llama, cfg=QUICK)
    with pytest.raises(LabError, match="is not the target this drafter was trained on"):  # its run.json tells
        probe(source, random_llama, features, wide_llama, cfg=QUICK)


def test_a_source_target_too_shallow_for_the_aux_layers_is_one_line(source, features, random_llama, tmp_path):
    shallow = _shallow(random_llama, tmp_path / "shallow")
    with pytest.raises(LabError, match=r"aux layer id\(s\) \[4, 5\] out of range.*\(--source-target .*\)$"):
        probe(_unrecorded(source, tmp_path / "imported"), random_llama, features, shallow, cfg=QUICK)


def test_a_drafter_without_recorded_aux_layers_is_measured_at_home(source, features, random_llama, tmp_path):
    """EAGLE releases may not record them (the features' are the ones it is probed on): the home run
    takes the features' aux layers, not an empty list."""
    bare = tmp_path / "bare"
    shutil.copytree(source, bare)
    cfg = json.loads((bare / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg.get("eagle_config", {}).pop("eagle_aux_hidden_state_layer_ids", None)
    (bare / "config.json").write_text(json.dumps(cfg))
    out = probe(bare, random_llama, features, random_llama, cfg=QUICK)
    ref = probe(source, random_llama, features, random_llama, cfg=QUICK)
    assert out["aux_cka"] == ref["aux_cka"] and out["home"] == ref["home"]


def test_val_data_naming_the_data_is_refused_before_any_signal(source, features, random_llama, monkeypatch):
    """The pilot's arms refuse it, but only after the zero-shot, home and CKA minutes."""
    monkeypatch.setattr(probe_mod, "evaluate", lambda *a, **k: pytest.fail("a signal was measured"))
    with pytest.raises(LabError, match="--val-data is the --data path"):
        probe(source, random_llama, features, cfg=ProbeConfig(max_sequences=4, pilot_steps=4), val_data=features)


def test_a_cka_just_under_the_line_does_not_read_as_on_it():
    verdict, reason = decide(1.0, 2.0, [0.9, 0.79996, 0.9], ProbeThresholds())
    assert verdict == "train from scratch" and "drops to 0.79996 (< 0.8)" in reason
    assert "min CKA 0.812 >= 0.8" in decide(1.0, 2.0, [0.9, 0.81234, 0.9], ProbeThresholds())[1]


ADDED = 8


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
