"""Probe review (s59): where the targets' tokenizers differ, the reuse ratio reads zero-shot and home
accept over the same held-out text, and a verdict without aux CKA says why it has none."""

from __future__ import annotations

import json

import pytest

from drafter_lab.data.capture import prepare_features
from drafter_lab.data.shards import FeatureSet
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.drafter.transfer import token_map
from drafter_lab.experiments import probe as probe_mod
from drafter_lab.experiments.probe import ProbeConfig, ProbeThresholds, probe
from drafter_lab.targets.hf import load_target_head, load_tokenizer
from drafter_lab.train.metrics import evaluate

QUICK = ProbeConfig(max_sequences=8, pilot_steps=0, cka_tokens=32, ttt_steps=2)


def _decided(monkeypatch) -> list[tuple]:
    seen = []
    real = probe_mod.decide
    monkeypatch.setattr(probe_mod, "decide", lambda *a, **k: seen.append(a) or real(*a, **k))
    return seen


def test_reuse_compares_zero_shot_and_home_over_the_same_sequences(source, next_version, random_llama, monkeypatch):
    """Home accept is measured over the sequences the source's vocabulary spells wholly; the zero-shot
    figure it was divided into was over every held-out sequence, so the reuse ratio compared two texts."""
    new, feats = next_version
    seen = _decided(monkeypatch)
    result = probe(source, new, feats, random_llama, cfg=QUICK)
    assert 0 < result["home_sequences"] < result["held_out_sequences"]

    fs = FeatureSet(feats)
    val = fs.read(fs.require("val")[:QUICK.max_sequences])
    target = load_target_head(new)
    tokens = token_map(load_tokenizer(random_llama), load_tokenizer(new), target.vocab_size)
    spelled = [s for s in val if bool((tokens[s.input_ids] >= 0).all())]
    drafter = load_drafter(source, target=target, vocab_size=target.vocab_size)
    there = evaluate(drafter, target.lm_head_weight(), spelled, QUICK.ttt_steps, QUICK.batch_size)
    assert len(spelled) == result["home_sequences"]
    assert there["positions"] < result["zero_shot"]["positions"]
    zero_arg, home_arg = seen[-1][:2]
    # the figures themselves may agree (a drafter of 4 steps may accept nothing anywhere); the texts differ
    assert zero_arg == there["simulated_accept_len"]
    assert home_arg == result["home"]["simulated_accept_len"]
    assert json.dumps(result["zero_shot_home_sequences"], sort_keys=True) == json.dumps(there, sort_keys=True)  # NaN too


def test_one_tokenizer_keeps_one_zero_shot(source, random_llama, features, monkeypatch):
    seen = _decided(monkeypatch)
    result = probe(source, random_llama, features, random_llama, cfg=QUICK)
    assert result["home_sequences"] == result["held_out_sequences"] and result["zero_shot_home_sequences"] is None
    assert seen[-1][0] == result["zero_shot"]["simulated_accept_len"]


@pytest.fixture(scope="module")
def control_token_version(random_llama, features, tmp_path_factory):
    """The random Llama with an added control token that its chat template writes before every message
    (as Mistral v0.3's [INST], a string of pieces in v0.1's vocabulary): the source's vocabulary spells
    no held-out sequence wholly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drafter_lab.targets.hf import DEFAULT_CHAT_TEMPLATE

    root = tmp_path_factory.mktemp("s59-control-token")
    tok = AutoTokenizer.from_pretrained(str(random_llama))
    tok.add_special_tokens({"additional_special_tokens": ["[INST]"]})
    tok.chat_template = DEFAULT_CHAT_TEMPLATE.replace("{{ '<|im_start|>'", "{{ '[INST]<|im_start|>'")
    model = AutoModelForCausalLM.from_pretrained(str(random_llama))
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    prepare_features(root / "model", features.parent / "convs.jsonl", root / "features", max_length=64,
                     val_fraction=0.25, batch_size=12)
    return root / "model", root / "features"


def test_a_verdict_without_cka_says_why_when_the_source_target_was_given(source, control_token_version,
                                                                        random_llama):
    """No home run and no CKA where no held-out sequence can be read by the source target: the reason said
    "no source target given" beside --source-target."""
    new, feats = control_token_version
    result = probe(source, new, feats, random_llama, cfg=QUICK)
    assert result["home"] is None and result["aux_cka"] is None and result["home_sequences"] == 0
    assert result["verdict"] == "train from scratch"
    assert result["reason"].startswith("no held-out sequence is written wholly in tokens the source target's "
                                       "vocabulary has: aux alignment unknown")
    assert probe(source, new, feats, cfg=QUICK)["reason"].startswith("no source target given")
    assert probe_mod.decide(1.0, None, None, ProbeThresholds())[1].startswith("no source target given")


def test_a_reuse_over_the_readable_sequences_says_so(source, next_version, random_llama, monkeypatch):
    """Its reason's zero-shot figure is then not the table's (every held-out sequence): it names the text."""
    new, feats = next_version
    real = probe_mod._at_home

    def at_home(*args):
        home, ckas = real(*args)
        return {**home, "simulated_accept_len": 0.5}, ckas
    monkeypatch.setattr(probe_mod, "_at_home", at_home)
    result = probe(source, new, feats, random_llama, cfg=QUICK, thresholds=ProbeThresholds(reuse_fraction=0.0))
    zero = result["zero_shot_home_sequences"]["simulated_accept_len"]
    assert result["verdict"] == "reuse as is" and result["reason"] == (
        f"zero-shot accept {zero:.2f} keeps {zero / 0.5:.0%} of home accept 0.50 (>= 0%); both over the "
        f"{result['home_sequences']} of {result['held_out_sequences']} held-out sequences the source target can read")
