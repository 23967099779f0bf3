"""The probe on a real (random) HF Llama and a trained source drafter: the pilot and its verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.data.shards import FeatureSet
from drafter_lab.data.vocab import build_vocab, compare_vocabs, vocab_of_drafter
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.experiments.pilot import closing, lead_text
from drafter_lab.experiments.probe import ProbeConfig, ProbeThresholds, decide, probe
from drafter_lab.targets.hf import load_target_head, load_tokenizer
from drafter_lab.train import sources
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics import evaluate
from drafter_lab.train.metrics_log import read_metrics

RECIPE = TrainConfig(draft_vocab_size=64, max_steps=4, epochs=10, batch_size=4, ttt_steps=2, warmup_steps=1,
                     log_every=2, threads=1)


@pytest.fixture(scope="module")
def source(random_llama, features, tmp_path_factory):
    """A drafter trained on the target's features: the "old" drafter the probe is asked about."""
    root = tmp_path_factory.mktemp("probe")
    train(RECIPE, random_llama, features, root / "source")
    return root / "source", features


def _pilot(*leads, steps=(0, 10, 20, 30)):
    curve = [{"step": s, "scratch_cond_acc_0": 0.3, "transfer_cond_acc_0": 0.3 + x, "scratch_simulated_accept_len": 1.0,
              "transfer_simulated_accept_len": 1.0} for s, x in zip(steps, leads)]
    return {"steps": steps[-1], "curve": curve, "gain": leads[-1]}


def test_pilot_decides_transfer_against_scratch_before_cka():
    th = ProbeThresholds()
    verdict, reason = decide(1.0, 2.0, [0.5, 0.5, 0.5], th, _pilot(0.0, 0.20, 0.15, 0.12))
    assert verdict == "transfer with remap"
    assert reason.startswith("pilot of 30 steps per arm: transfer - scratch = +20.0 / +15.0 / +12.0 points at "
                             "steps 10 / 20 / 30 (>= 1 at the end)")
    assert "closing" not in reason
    verdict, reason = decide(1.0, 2.0, [0.99, 0.99, 0.99], th, _pilot(0.0, 0.20, 0.05, 0.005))
    assert verdict == "train from scratch" and "(< 1 at the end)" in reason  # CKA 0.99 does not overrule it
    verdict, reason = decide(1.0, 2.0, None, th, _pilot(0.0, 0.30, 0.10, 0.05))
    assert verdict == "transfer with remap" and reason.endswith(
        "a much longer budget may erase it (`train --stop-if-behind SCRATCH_RUN` stops it if it falls behind)")
    assert decide(1.9, 2.0, None, th, _pilot(0.0, -0.1, -0.1, -0.1))[0] == "reuse as is"  # reuse is checked first
    # A transfer fine-tuned at a reduced rate: the verdict stands, with the lab's long-run caution.
    slow = {**_pilot(0.0, 0.2, 0.2, 0.2), "transfer_lr_scale": 0.1}
    verdict, reason = decide(1.0, 2.0, None, th, slow)
    assert verdict == "transfer with remap" and reason.endswith(
        "for a long run, fine-tune at the full rate (`train --stop-if-behind SCRATCH_RUN` stops it if it falls behind)")
    assert "at 0.1x the rate" in reason and "rate" not in decide(1.0, 2.0, None, th, _pilot(0.0, 0.2, 0.2, 0.2))[1]


def test_lead_text_and_closing():
    p = _pilot(0.5, 0.361, 0.12, 0.074)
    assert lead_text(p, 0.01) == "+36.1 / +12.0 / +7.4 points at steps 10 / 20 / 30"
    assert closing(p) and not closing(_pilot(0.0, 0.1, 0.08, 0.06)) and not closing(_pilot(0.0, 0.2, 0.0, -0.05))


def test_pilot_trains_both_arms_with_one_recipe(source, random_llama, tmp_path, monkeypatch):
    src, feats = source
    cfg = ProbeConfig(max_sequences=8, cka_tokens=256, ttt_steps=2, pilot_steps=8)
    heads = []  # the target head that train() loads itself; the probe hands its own to the pilot
    monkeypatch.setattr(sources, "load_target_head", lambda *a, **k: heads.append(a) or load_target_head(*a, **k))
    out = probe(src, random_llama, feats, random_llama, cfg=cfg, pilot_recipe=RECIPE, pilot_dir=tmp_path)
    assert heads == []
    pilot = out["pilot"]
    assert [r["step"] for r in pilot["curve"]] == [0, 2, 4, 6, 8]
    runs = {arm: json.loads((tmp_path / arm / "run.json").read_text()) for arm in ("scratch", "transfer")}
    assert runs["scratch"]["init_from"] is None and runs["transfer"]["init_from"]["source"] == str(src)
    assert runs["transfer"]["init_from"]["remap"] is True
    assert runs["scratch"]["config"] == runs["transfer"]["config"]
    assert runs["scratch"]["config"]["max_steps"] == 8 and runs["scratch"]["config"]["warmup_steps"] == 1
    assert runs["scratch"]["config"]["scan_features"] is False  # 8 batches read, not the whole set
    assert runs["scratch"]["drafter"] == runs["transfer"]["drafter"]
    vals = {arm: {r["step"]: r["cond_acc_0"] for r in read_metrics(tmp_path / arm) if r["split"] == "val"}
            for arm in runs}
    for row in pilot["curve"]:
        assert row["scratch_cond_acc_0"] == vals["scratch"][row["step"]]
        assert row["transfer_cond_acc_0"] == vals["transfer"][row["step"]]
    assert pilot["gain"] == vals["transfer"][8] - vals["scratch"][8]
    assert out["reason"] == decide(out["zero_shot"]["simulated_accept_len"], out["home"]["simulated_accept_len"],
                                   out["aux_cka"], ProbeThresholds(), pilot)[1]


def test_every_signal_can_be_measured_on_a_validation_set_of_its_own(source, held_out, random_llama, tmp_path):
    src, feats = source
    cfg = ProbeConfig(max_sequences=8, cka_tokens=256, ttt_steps=2, pilot_steps=4)
    out = probe(src, random_llama, feats, random_llama, cfg=cfg, pilot_recipe=RECIPE, pilot_dir=tmp_path,
                val_data=held_out)
    fs = FeatureSet(held_out)
    refs = (fs.index("train") + fs.index("val"))[:8]
    assert out["held_out_sequences"] == len(refs) and fs.index("val") and out["val_data"] == str(held_out)
    target = load_target_head(random_llama)
    drafter = load_drafter(src, target=target)
    zero = evaluate(drafter, target.lm_head_weight(), fs.read(refs), 2, cfg.batch_size)
    assert out["zero_shot"] == zero
    split = evaluate(drafter, target.lm_head_weight(), FeatureSet(feats).sequences("val")[:8], 2, cfg.batch_size)
    assert out["zero_shot"]["positions"] != split["positions"]  # not the data's val split
    for arm in ("scratch", "transfer"):
        assert json.loads((tmp_path / arm / "run.json").read_text())["features"]["val_data"] == str(held_out)


def test_cli_without_source_target_takes_the_pilots_verdict(source, random_llama, tmp_path):
    src, feats = source
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[train]\nbatch_size = 4\nttt_steps = 2\nlog_every = 2\n")
    scratch_space = tmp_path / "tmp"
    scratch_space.mkdir()
    for gain_line, verdict in ((-1.0, "transfer with remap"), (1.0, "train from scratch")):
        out = tmp_path / f"probe{gain_line}.json"
        subprocess.run(
            [sys.executable, "-m", "drafter_lab", "probe", "--drafter", str(src), "--target", str(random_llama),
             "--data", str(feats), "--pilot-steps", "4", "--pilot-config", str(recipe), "--ttt-steps", "2",
             "--max-sequences", "8", "--pilot-min-gain", str(gain_line), "--threads", "1", "--json", str(out)],
            check=True, capture_output=True, env={**os.environ, "TMPDIR": str(scratch_space)})
        assert not list(scratch_space.iterdir())  # the pilot's arms went to a temporary directory, now gone
        result = json.loads(out.read_text())
        assert result["verdict"] == verdict and result["reason"].startswith("pilot of 4 steps per arm")
        assert [r["step"] for r in result["pilot"]["curve"]] == [0, 1, 2, 3, 4]


def test_cli_bad_pilot_recipe_is_one_line_naming_the_file(source, random_llama, tmp_path):
    src, feats = source
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[train]\nbatch_sise = 4\n")
    out = tmp_path / "probe.json"
    run = subprocess.run(
        [sys.executable, "-m", "drafter_lab", "probe", "--drafter", str(src), "--target", str(random_llama),
         "--data", str(feats), "--pilot-config", str(recipe), "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 2 and not out.exists()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(recipe) in lines[0] and "batch_sise" in lines[0]


def test_the_pilot_trains_in_the_sources_residual_variant_and_rope(random_llama, features, tmp_path):
    """A norm_before_residual source (speculators' default) with llama3-scaled RoPE (SpecForge's Llama-3.1
    drafters): both pilot arms take its residual and RoPE, so the transfer arm's weights work as they
    did and the scratch arm is the same model."""
    llama3 = '{"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, ' \
             '"original_max_position_embeddings": 64, "rope_type": "llama3"}'
    src = tmp_path / "source"
    train(dataclasses.replace(RECIPE, drafter_norm_before_residual=True, drafter_rope_scaling=llama3),
          random_llama, features, src)
    cfg = ProbeConfig(max_sequences=8, cka_tokens=256, ttt_steps=2, pilot_steps=4)
    probe(src, random_llama, features, cfg=cfg, pilot_recipe=RECIPE, pilot_dir=tmp_path / "pilot")
    for arm in ("scratch", "transfer"):
        made = json.loads((tmp_path / "pilot" / arm / "run.json").read_text())["drafter"]
        assert made["norm_before_residual"] and made["rope_scaling"] == json.loads(llama3), arm


def test_a_drafter_reading_other_aux_layers_than_the_features_is_refused(source, random_llama, tmp_path):
    """Its fc would read other layers than it was trained on (the zero-shot figure meaningless) and CKA
    would pair different layers: refused in one line naming the drafter."""
    import shutil

    from drafter_lab.errors import LabError

    src, feats = source
    other = tmp_path / "other-aux"
    shutil.copytree(src, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 3, 4]  # SGLang's ids: hidden_states [1, 4, 5]
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 4, 5]  # and vLLM's
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LabError, match=r"reads aux layers \[1, 4, 5\] \(hidden_states indices\), the features hold "
                                       r"\[2, 4, 5\]") as e:
        probe(other, random_llama, feats, cfg=ProbeConfig(max_sequences=4, pilot_steps=0))
    assert str(other) in str(e.value)


def test_at_home_the_drafter_embeds_with_its_own_targets_embedding(source, random_llama, tmp_path, monkeypatch):
    """The home accept length is the drafter on its own target: with that target's token embedding, not the
    new one's (they differ as much as the versions do)."""
    from transformers import AutoModelForCausalLM

    from drafter_lab.experiments import probe as probe_mod
    from drafter_lab.targets.fingerprint import fingerprint

    src, feats = source
    model = AutoModelForCausalLM.from_pretrained(str(random_llama))
    model.get_input_embeddings().weight.data += 0.5
    old = tmp_path / "old-version"
    model.save_pretrained(old)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (random_llama / name).exists():
            (old / name).write_bytes((random_llama / name).read_bytes())
    mine = tmp_path / "drafter"  # trained on the old version, as its run record says
    shutil.copytree(src, mine)
    run = json.loads((src / "run.json").read_text())
    run["target"]["fingerprint"] = fingerprint(old)
    (mine / "run.json").write_text(json.dumps(run))
    seen = []
    real = probe_mod.evaluate
    monkeypatch.setattr(probe_mod, "evaluate", lambda drafter, *a, **k: seen.append(drafter) or real(drafter, *a, **k))
    probe(mine, random_llama, feats, old, cfg=ProbeConfig(max_sequences=4, pilot_steps=0, cka_tokens=64))
    zero_shot, home = seen
    assert torch.equal(home.embed_tokens.weight, model.get_input_embeddings().weight.detach())
    assert not torch.equal(zero_shot.embed_tokens.weight, home.embed_tokens.weight)


def test_a_nan_cka_is_no_basis_for_transfer_wherever_it_sits():
    """min() over a nan gives the nan or a number depending on the order: each order, the same verdict."""
    for ckas in ([math.nan, 0.9, 0.9], [0.9, math.nan, 0.9]):
        verdict, reason = decide(1.0, 2.0, ckas, ProbeThresholds())
        assert verdict == "train from scratch" and reason.startswith("aux layer CKA is undefined"), ckas


def test_cli_json_naming_a_directory_is_refused_before_the_probe_runs(tmp_path, capsys, monkeypatch):
    """It is written last: refused only then, the probe's and the pilot's minutes were lost."""
    from drafter_lab.experiments import probe as probe_mod

    monkeypatch.setattr(probe_mod, "probe", lambda *a, **k: pytest.fail("the probe ran"))
    argv = ["probe", "--drafter", "d", "--target", "t", "--data", "f", "--json", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {tmp_path}: is a directory: --json takes a file to write\n"


def test_the_vocabs_are_compared_by_token_where_the_targets_tokenizers_differ(source, next_version, random_llama):
    """Positions and shared tokens counted by what the ids stand for in each target's tokenizer (both
    byte-level: a token string is its bytes), not by id; with one tokenizer, by id."""
    src, own_features = source
    new, feats = next_version
    cfg = ProbeConfig(max_sequences=4, pilot_steps=0, cka_tokens=64)
    v = probe(src, new, feats, random_llama, cfg=cfg)["vocab"]
    assert v["by"] == "token" and v["source_tokenizer"] == "--source-target"
    drafter, new_vocab = load_drafter(src, target=load_target_head(new)), build_vocab(feats, 64)
    old = load_tokenizer(random_llama).convert_ids_to_tokens(vocab_of_drafter(drafter).used.tolist())
    mine = load_tokenizer(new).convert_ids_to_tokens(new_vocab.used.tolist())
    assert v["same_positions"] == sum(a == b for a, b in zip(old, mine))
    assert v["shared_tokens"] == len(set(old) & set(mine)) and v["only_a_count"] == len(set(old) - set(mine))
    assert v["shared_tokens"] != compare_vocabs(vocab_of_drafter(drafter), new_vocab)["shared_tokens"]  # by id
    same = probe(src, random_llama, own_features, random_llama, cfg=cfg)["vocab"]
    assert same["by"] == "id" and same["source_tokenizer"] == "--source-target"


def test_at_home_the_source_target_reads_the_same_text_where_the_tokenizers_differ(source, next_version,
                                                                                   random_llama, monkeypatch):
    """Fed the new target's ids, the source target would read other text: the home run and CKA take the
    held-out sequences the source's vocabulary spells wholly, their ids mapped token by token."""
    from drafter_lab.experiments import probe as probe_mod

    src, _ = source
    new, feats = next_version
    fed = []
    real = probe_mod._source_features
    monkeypatch.setattr(probe_mod, "_source_features", lambda t, seqs, ids: fed.extend(seqs) or real(t, seqs, ids))
    result = probe(src, new, feats, random_llama, cfg=ProbeConfig(max_sequences=8, pilot_steps=0, cka_tokens=32))
    ours = {s.seq_id: s for s in FeatureSet(feats).read(FeatureSet(feats).require("val")[:8])}
    old_tok, new_tok = load_tokenizer(random_llama), load_tokenizer(new)
    assert fed
    for s in fed:
        assert old_tok.decode(s.input_ids) == new_tok.decode(ours[s.seq_id].input_ids)
        assert not torch.equal(s.input_ids, ours[s.seq_id].input_ids)
    assert result["home_sequences"] == len(fed) < len(ours) and result["home"] is not None


def test_a_source_target_other_than_the_drafters_is_refused_before_the_signals(source, random_llama, wide_llama,
                                                                               monkeypatch):
    from drafter_lab.errors import LabError
    from drafter_lab.experiments import probe as probe_mod

    src, feats = source
    monkeypatch.setattr(probe_mod, "evaluate", lambda *a, **k: pytest.fail("a signal was measured before the check"))
    with pytest.raises(LabError, match=f"--source-target {wide_llama} is not the target this drafter was trained on"):
        probe(src, random_llama, feats, wide_llama, cfg=ProbeConfig(max_sequences=8, pilot_steps=0, cka_tokens=32))
