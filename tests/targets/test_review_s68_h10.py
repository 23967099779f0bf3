"""Review s68 (h10) of targets/build.py, second mutation pass: what a micro build records of its own stages
(each stage's seconds, the drift figures of the models it saved), with training recorded, not run."""

from __future__ import annotations

import dataclasses

import pytest

from drafter_lab.targets import build as build_mod
from drafter_lab.targets.presets import PRESETS


@pytest.fixture
def micro_build(tmp_path, monkeypatch):
    """`micro_build(**config_changes)`: the pair.json of a micro build whose train_lm only records its call
    (the descriptions of the calls in `micro_build.calls`)."""
    def train(model, sources, **kw):
        build.calls.append(kw["description"])
        return {"steps": kw["steps"], "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}

    monkeypatch.setattr(build_mod, "train_lm", train)

    def build(**changes):
        cfg = dataclasses.replace(PRESETS["micro"], **changes)
        return build_mod.build_pair(cfg, tmp_path / "pair", cache_dir=tmp_path / "cache")
    build.calls = []
    return build


def test_each_stage_s_seconds_are_a_part_of_the_call_rounded_to_hundredths(micro_build):
    """A stage's seconds are its end less its start (a sum was the machine's uptime, twice over), in
    hundredths as the other figures are; no bound on how long anything takes."""
    seconds = micro_build()["build_seconds"]
    assert set(seconds) == {"corpus", "tokenizer", "base", "tuned", "drift", "this_call"}
    parts = [seconds[k] for k in ("corpus", "tokenizer", "drift")]
    assert all(0 <= s <= seconds["this_call"] for s in parts)
    assert sum(parts) <= seconds["this_call"] + 0.03  # three roundings
    assert all(round(s, 2) == s for s in seconds.values())


def test_drift_zero_copies_base_and_measures_it_on_the_saved_drift_inputs(micro_build, tmp_path):
    """No fine-tune at drift 0: train_lm is not called for tuned, whose record says nothing was trained, and
    the drift figures compare base with itself on each side's saved windows, and on both together."""
    from safetensors.torch import load_file

    pair = micro_build(drift=0.0)
    assert micro_build.calls == ["train base"]
    assert pair["tuned"]["train"] == {"steps": 0, "tokens": 0, "first_loss": None, "final_loss": None,
                                      "seconds": 0.0}
    assert pair["tuned"]["fingerprint"] == pair["base"]["fingerprint"]
    tokenizer = "tokenizer.json"  # tuned is loaded alone, its tokenizer beside it
    assert (tmp_path / "pair" / "tuned" / tokenizer).read_bytes() == (tmp_path / "pair" / "base" / tokenizer).read_bytes()
    (base_dir,) = (tmp_path / "cache").glob("base-*")
    windows = load_file(str(base_dir / "drift-inputs.safetensors"))
    figures = pair["drift_figures"]
    for name, side in (("base_text", "base"), ("shifted_text", "shifted")):
        assert figures[name]["tokens"] == windows[side].numel() > 0
    assert figures["all"]["tokens"] == windows["base"].numel() + windows["shifted"].numel()
    for fig in figures.values():
        assert fig["kl"] == pytest.approx(0, abs=1e-9) and fig["base_nll"] == fig["tuned_nll"]
        assert fig["cka"] == pytest.approx([1.0] * (PRESETS["micro"].num_layers + 1), abs=1e-4)


def test_base_is_the_configured_untied_llama_seeded_by_the_config(micro_build, tmp_path):
    """The saved base (its initial weights here: nothing is trained) is the config's shape, with its own
    lm_head, and its weights are the same whatever the caller's RNG held."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    cfg = PRESETS["micro"]
    torch.manual_seed(123)
    pair = micro_build()
    saved = AutoConfig.from_pretrained(tmp_path / "pair" / "base")
    tok = AutoTokenizer.from_pretrained(tmp_path / "pair" / "base")
    assert (saved.vocab_size, saved.hidden_size, saved.intermediate_size, saved.num_hidden_layers,
            saved.num_attention_heads, saved.num_key_value_heads, saved.max_position_embeddings) == (
        cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
        cfg.max_position_embeddings)
    assert (saved.tie_word_embeddings, saved.bos_token_id) == (False, None)
    assert (saved.eos_token_id, saved.pad_token_id) == (tok.eos_token_id, tok.pad_token_id) != (None, None)
    h, v, n = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    kv = h // cfg.num_heads * cfg.num_kv_heads
    layer = 2 * h * h + 2 * h * kv + 3 * h * cfg.intermediate_size + 2 * h
    assert pair["base"]["params"] == 2 * v * h + n * layer + h  # embed, lm_head, layers, norm

    torch.manual_seed(456)
    again = build_mod.build_pair(cfg, tmp_path / "again", cache_dir=tmp_path / "cache2")
    assert again["base"]["fingerprint"] == pair["base"]["fingerprint"]
