"""Export and drafter reading as a user meets them: re-exported serving settings, non-finite weights,
wrong-type config fields, a target given as the drafter, and which pairing mismatch is named first."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import read_checkpoint, read_config, save_drafter
from drafter_lab.errors import LabError
from drafter_lab.spec.pairing import load_for_target

from .test_model import random_drafter, small_config


@pytest.fixture
def drafter():
    return random_drafter(small_config(), seed=5, dtype=torch.float32)


def _export(src, out, *flags) -> int:
    return main(["export", "--drafter", str(src), "--format", "speculators", "--out", str(out), *flags])


def _serving(path) -> tuple[int, dict]:
    sc = json.loads((path / "config.json").read_text())["speculators_config"]
    return sc["proposal_methods"][0]["speculative_tokens"], sc["verifier"]


def test_reexporting_a_speculators_drafter_keeps_its_draft_length_and_verifier(tmp_path, drafter, capsys):
    """No run.json beside it: the source's own speculators_config is what vLLM should still be told,
    unless a flag says otherwise (it was reset to 5 and no verifier)."""
    save_drafter(drafter, tmp_path / "src", formats.SPECULATORS, speculative_tokens=3, verifier="org/target",
                 verifier_architectures=("LlamaForCausalLM",))
    assert _export(tmp_path / "src", tmp_path / "again") == 0
    assert _serving(tmp_path / "again") == (3, {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]})
    assert _export(tmp_path / "src", tmp_path / "k2", "--speculative-tokens", "2") == 0
    assert _serving(tmp_path / "k2") == (2, {"name_or_path": "org/target", "architectures": ["LlamaForCausalLM"]})
    assert _export(tmp_path / "src", tmp_path / "other", "--verifier", "org/other") == 0
    assert _serving(tmp_path / "other") == (3, {"name_or_path": "org/other", "architectures": []})

    # a malformed draft length is refused when it would be carried, not when a flag replaces it
    cfg = json.loads((tmp_path / "src/config.json").read_text())
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = "3"
    (tmp_path / "src/config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert _export(tmp_path / "src", tmp_path / "bad") == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {tmp_path / 'src/config.json'}: config's 'speculative_tokens' is '3', not a " \
                          "positive integer"
    assert _export(tmp_path / "src", tmp_path / "fixed", "--speculative-tokens", "4") == 0
    assert _serving(tmp_path / "fixed")[0] == 4


def test_a_local_verifier_is_written_as_its_absolute_path(tmp_path, drafter, monkeypatch):
    """`vllm serve DRAFTER` from another directory cannot find `targets/tuned`; a hub name stays as given."""
    save_drafter(drafter, tmp_path / "src")
    (tmp_path / "targets/tuned").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert _export("src", "local", "--verifier", "targets/tuned") == 0
    assert _serving(tmp_path / "local")[1]["name_or_path"] == str(tmp_path / "targets/tuned")
    assert _export("src", "hub", "--verifier", "org/tuned") == 0
    assert _serving(tmp_path / "hub")[1]["name_or_path"] == "org/tuned"


@pytest.mark.parametrize("fmt, name, bad", [(formats.SGLANG, "fc.weight", float("nan")),
                                            (formats.SPECULATORS, "layers.0.mlp.up_proj.weight", float("inf"))])
def test_a_non_finite_weight_is_refused_when_read(tmp_path, drafter, capsys, fmt, name, bad):
    """One NaN weight exported fine and trained (--init-from) into an all-NaN drafter."""
    save_drafter(drafter, tmp_path / "src", fmt)
    weights = tmp_path / "src/model.safetensors"
    state = load_file(str(weights))
    state[name][0, 0] = bad
    state["verifier_norm.weight"] = torch.full((4,), float("nan"))  # carried, never loaded: no reason to refuse
    save_file(state, str(weights))
    with pytest.raises(LabError, match=f"tensor '{name}' holds NaN or Inf values") as e:
        read_checkpoint(tmp_path / "src")
    assert e.value.path == str(weights)
    capsys.readouterr()
    assert main(["export", "--drafter", str(tmp_path / "src"), "--format", "sglang", "--out", str(tmp_path / "o")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt, key, value, message", [
    (formats.SGLANG, "num_hidden_layers", "1", "config's 'num_hidden_layers' is '1', not an integer"),
    (formats.SGLANG, "logit_scale", "1.0", "config's 'logit_scale' is '1.0', not a number"),
    (formats.SGLANG, "logit_scale", True, "config's 'logit_scale' is True, not a number"),
    (formats.SPECULATORS, "num_hidden_layers", "1", "config's 'num_hidden_layers' is '1', not an integer"),
])
def test_a_wrong_type_config_field_is_named_as_such(tmp_path, drafter, fmt, key, value, message):
    """"1" read as "drafter has 1 layers; ... exactly one midlayer", "1.0" as "logit_scale 1.0 is not supported"."""
    save_drafter(drafter, tmp_path / "d", fmt)
    cfg = json.loads((tmp_path / "d/config.json").read_text())
    (cfg["transformer_layer_config"] if fmt == formats.SPECULATORS else cfg)[key] = value
    (tmp_path / "d/config.json").write_text(json.dumps(cfg))
    with pytest.raises(LabError) as e:
        read_config(tmp_path / "d")
    assert str(e.value) == f"{tmp_path / 'd/config.json'}: {message}"


def test_a_target_model_given_as_the_drafter_is_named_so(tmp_path, drafter, capsys):
    """A target's config read as a drafter "of 8 layers"; EAGLE's own one-layer `LlamaForCausalLM` is a drafter."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path / "target")
    assert main(["export", "--drafter", str(tmp_path / "target"), "--format", "sglang", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'target/config.json'}: a target model " \
                                              "(LlamaForCausalLM, 8 layers), not a drafter: give the drafter's directory"
    save_drafter(drafter, tmp_path / "eagle")
    cfg = json.loads((tmp_path / "eagle/config.json").read_text())
    (tmp_path / "eagle/config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    assert read_config(tmp_path / "eagle")[0] == drafter.config
    (tmp_path / "eagle/config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    with pytest.raises(LabError, match="drafter has 2 layers"):
        read_config(tmp_path / "eagle")


def _target(vocab: int, hidden: int, layers: int = 8):
    return SimpleNamespace(vocab_size=vocab, hidden_size=hidden, num_layers=layers)


@pytest.mark.parametrize("target, message", [
    (_target(200, 64), "drafter hidden size does not fit the target: fc takes 3 x 40"),
    (_target(200, 40, layers=4), "aux layer id(s) [4, 5] out of range"),
    (_target(200, 40), "it embeds with its own 101-row matrix"),  # the flag would refuse it too
])
def test_a_mismatch_no_flag_fixes_is_named_before_the_vocab(tmp_path, drafter, target, message):
    """The vocab mismatch's --allow-other-target hint came first, then with the flag the real mismatch."""
    save_drafter(drafter, tmp_path / "d")
    with pytest.raises(LabError) as e:
        load_for_target(tmp_path / "d", target)
    assert message in str(e.value) and "--allow-other-target" not in str(e.value)


def test_the_vocab_hint_stays_where_the_flag_helps(tmp_path):
    save_drafter(random_drafter(small_config(target_hidden_size=48), seed=5, dtype=torch.float32), tmp_path / "d")
    with pytest.raises(LabError, match="pass --allow-other-target"):
        load_for_target(tmp_path / "d", _target(200, 48))
