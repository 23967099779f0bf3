"""`train --draft-config`: a SpecForge/SGLang draft-model config.json sets the drafter's shape."""

from __future__ import annotations

import json

from drafter_lab.cli import main


def _draft_config(path, target_dir, **over):
    target = json.loads((target_dir / "config.json").read_text())
    theta = target.get("rope_theta") or target["rope_parameters"]["rope_theta"]
    cfg = {  # as SpecForge's configs/*-eagle3.json: one Llama layer, the target's vocab and RoPE
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": 32, "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": target["vocab_size"], "draft_vocab_size": 100, "rope_theta": theta, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False, **over,
    }
    path.write_text(json.dumps(cfg))
    return path


def _train(peaked_llama, features, out, *extra) -> int:
    return main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out),
                 "--max-steps", "2", "--batch-size", "8", "--eval-every", "0", "--eval-at-start", "false",
                 "--scan-features", "false", "--threads", "1", *extra])


def test_the_drafter_takes_the_configs_shape_and_flags_still_win(peaked_llama, features, tmp_path, capsys):
    cfg = _draft_config(tmp_path / "eagle3.json", peaked_llama)
    assert _train(peaked_llama, features, tmp_path / "a", "--draft-config", str(cfg)) == 0
    assert "norm_before_residual" not in capsys.readouterr().err  # a plain drafter: no serving note
    made = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (made["hidden_size"], made["intermediate_size"], made["num_attention_heads"],
            made["num_key_value_heads"], made["draft_vocab_size"]) == (32, 96, 2, 1, 100)
    assert _train(peaked_llama, features, tmp_path / "b", "--draft-config", str(cfg), "--draft-vocab-size", "64") == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["draft_vocab_size"] == 64


def test_a_config_for_another_target_is_refused(peaked_llama, features, tmp_path, capsys):
    cfg = _draft_config(tmp_path / "k2.json", peaked_llama, vocab_size=163840)
    assert _train(peaked_llama, features, tmp_path / "a", "--draft-config", str(cfg)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "k2.json: made for another target: vocab_size 163840" in err
    assert not (tmp_path / "a").exists()
    two = _draft_config(tmp_path / "two.json", peaked_llama, num_hidden_layers=2)
    assert _train(peaked_llama, features, tmp_path / "a", "--draft-config", str(two)) == 2
    assert "exactly one midlayer" in capsys.readouterr().err


def test_a_speculators_config_brings_its_residual_variant(peaked_llama, features, tmp_path, capsys):
    """speculators trains norm_before_residual drafters by default: a run from its config (or the flag)
    trains that variant, and the run directory says so."""
    cfg = _draft_config(tmp_path / "sp.json", peaked_llama, norm_before_residual=True)
    assert _train(peaked_llama, features, tmp_path / "a", "--draft-config", str(cfg)) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["norm_before_residual"] is True
    assert "is a norm_before_residual drafter: vLLM serves it" in " ".join(capsys.readouterr().err.split())
    assert _train(peaked_llama, features, tmp_path / "b", "--drafter-norm-before-residual", "true",
                  "--draft-vocab-size", "100") == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["norm_before_residual"] is True
    assert _train(peaked_llama, features, tmp_path / "c", "--init-from", str(tmp_path / "a"),
                  "--draft-config", str(cfg)) == 0
    plain = _draft_config(tmp_path / "plain.json", peaked_llama)  # the same shape, plain EAGLE-3's residual
    assert _train(peaked_llama, features, tmp_path / "d", "--init-from", str(tmp_path / "a"),
                  "--draft-config", str(plain)) == 2
    assert "norm_before_residual=true, this one false" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "d").exists()


def test_a_specforge_llama3_config_brings_its_rope_scaling(peaked_llama, features, tmp_path, capsys):
    """SpecForge's Llama-3.1 draft configs copy the target's llama3 RoPE scaling, and SGLang serves the
    drafter with it: a run from such a config (or the flag) trains with it, and its directory says so."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    cfg = _draft_config(tmp_path / "l3.json", peaked_llama, rope_scaling=llama3)
    assert _train(peaked_llama, features, tmp_path / "a", "--draft-config", str(cfg)) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["rope_scaling"] == llama3
    assert _train(peaked_llama, features, tmp_path / "b", "--drafter-rope-scaling", json.dumps(llama3),
                  "--draft-vocab-size", "100") == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["rope_scaling"] == llama3
    assert _train(peaked_llama, features, tmp_path / "c", "--drafter-rope-scaling", '{"rope_type": "yarn"}',
                  "--draft-vocab-size", "100") == 2
    assert "--drafter-rope-scaling: RoPE scaling 'yarn' is not supported" in " ".join(capsys.readouterr().err.split())
    plain = _draft_config(tmp_path / "plain.json", peaked_llama)
    assert _train(peaked_llama, features, tmp_path / "d", "--init-from", str(tmp_path / "a"),
                  "--draft-config", str(plain)) == 2
    assert "RoPE scaling is {" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "d").exists()
