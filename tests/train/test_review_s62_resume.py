"""Review s62: a resume refused for other training data names the keys that differ, not two dicts of
hashes; a --source-target that holds no tokenizer is refused before the features' scan, and the probe's
one without the model (a tokenizer alone) before its signals."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import probe
from drafter_lab.train import sources
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=64, max_steps=1, batch_size=8, ttt_steps=2, log_every=1, eval_every=1,
                  eval_batch_size=8, threads=1, max_length=64)


def _edited(features, to, skipped: int):
    """A copy of `features` whose manifest says something else (another manifest hash)."""
    shutil.copytree(features, to)
    manifest = json.loads((to / "manifest.json").read_text())
    (to / "manifest.json").write_text(json.dumps({**manifest, "skipped": {"no_assistant_turn": skipped}}))
    return to


def test_other_training_data_is_named_key_by_key(random_llama, stdlib_features, tmp_path):
    out = tmp_path / "run"
    train(CFG, random_llama, stdlib_features, out, val_data=_edited(stdlib_features, tmp_path / "val1", 7))
    data, val = _edited(stdlib_features, tmp_path / "data2", 9), _edited(stdlib_features, tmp_path / "val2", 8)
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, data, out, resume=True, val_data=val)
    text = str(e.value)
    assert "\n" not in text and "{" not in text, text
    h = "[0-9a-f]{12}"
    assert re.search(rf"--resume with other training data \(manifest_sha256 {h} there, {h} now; "
                     rf"val\.manifest_sha256 {h} there, {h} now\): the run would not be the same", text), text
    assert not re.search("[0-9a-f]{13}", text), text  # hashes shortened


@pytest.mark.parametrize("bad", ["features", "untokenized"])
def test_a_source_target_without_tokenizer_is_refused_before_the_scan(random_llama, stdlib_features, tmp_path,
                                                                      monkeypatch, bad):
    if bad == "features":  # a directory that is no model
        source_target, said = stdlib_features, "not a model or tokenizer directory"
    else:  # a model's config and weights without its tokenizer
        source_target, said = tmp_path / "model", "no tokenizer files"
        source_target.mkdir()
        for f in random_llama.iterdir():
            if f.name == "config.json" or f.suffix == ".safetensors":
                shutil.copy(f, source_target / f.name)

    def scan(*args, **kwargs):
        raise AssertionError("the features were scanned before --source-target was checked")

    monkeypatch.setattr(sources, "_scan", scan)
    with pytest.raises(LabError, match=said) as e:
        train(CFG, random_llama, stdlib_features, tmp_path / "run", init_from=tmp_path / "drafter",
              source_target=source_target)
    assert e.value.path == str(source_target)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kept, held", [(("tokenizer", "chat_template", "generation_config"), "a tokenizer alone"),
                                        (("tokenizer", "chat_template", "generation_config", "config"), "no weights")])
def test_the_probe_refuses_a_source_target_without_its_model_up_front(random_llama, stdlib_features, tmp_path,
                                                                      monkeypatch, kept, held):
    """check_source_target takes a tokenizer alone as given (it remaps by it), but the probe's home
    signal loads the source model: it failed with "config.json is missing" after the zero-shot signal."""
    drafter = tmp_path / "drafter"
    train(CFG, random_llama, stdlib_features, drafter)
    source_target = tmp_path / "source"
    source_target.mkdir()
    for f in random_llama.iterdir():
        if f.name.startswith(kept):
            shutil.copy(f, source_target / f.name)

    def evaluate(*args, **kwargs):
        raise AssertionError("a signal ran before --source-target was checked")

    monkeypatch.setattr(probe, "evaluate", evaluate)
    with pytest.raises(LabError, match=f"--source-target holds {held}: the probe runs the source target") as e:
        probe.probe(drafter, random_llama, stdlib_features, source_target,
                    cfg=probe.ProbeConfig(max_sequences=8, cka_tokens=256, ttt_steps=2, pilot_steps=0))
    assert e.value.path == str(source_target)
