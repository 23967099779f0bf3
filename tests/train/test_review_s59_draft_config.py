"""`train --draft-config` checks the config's RoPE base and vocabulary against the base and vocabulary
the lab builds the drafter with: the text model's, nested by layer type under transformers 5."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from drafter_lab.errors import LabError
from drafter_lab.train.commands import with_draft_config
from drafter_lab.train.config import TrainConfig


def _target(path, config):
    path.mkdir()
    config.save_pretrained(path)
    save_file({"stand_in": torch.zeros(1)}, str(path / "model.safetensors"))  # the check reads no weight
    return path


def _eagle3(path, vocab, theta):
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": vocab, "draft_vocab_size": 32, "rope_theta": theta, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False}))
    return path


@pytest.mark.parametrize("multimodal", [False, True], ids=["text", "wrapper"])
def test_a_config_made_for_a_gemma3_target_is_taken(tmp_path, multimodal):
    """Was refused as made for another target: rope_theta compared with 10000, as the nested base was
    not found, and a multimodal wrapper's vocab_size read from its top level."""
    text = transformers.Gemma3TextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         intermediate_size=128, num_hidden_layers=2, vocab_size=300,
                                         rope_theta=1e6, rope_local_base_freq=1e4)
    config = transformers.Gemma3Config(text_config=text.to_dict()) if multimodal else text
    target = _target(tmp_path / "gemma3", config)
    cfg = with_draft_config(TrainConfig(), _eagle3(tmp_path / "eagle3.json", 300, 1e6), target)
    assert (cfg.drafter_hidden_size, cfg.draft_vocab_size) == (64, 32)
    with pytest.raises(LabError, match="rope_theta 10000.0, the target .* has 1000000.0"):
        with_draft_config(TrainConfig(), _eagle3(tmp_path / "other.json", 300, 1e4), target)


def test_a_resume_that_would_build_another_drafter_is_refused(peaked_llama, features, tmp_path, capsys):
    """The drafter is rebuilt from the target's config on --resume: one saved by a lab that read the target
    otherwise (Gemma 3's RoPE base as 10000) went on with the saved weights under another RoPE."""
    from drafter_lab.cli import main

    out = tmp_path / "run"
    args = ["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out), "--max-steps", "2",
            "--batch-size", "8", "--eval-every", "0", "--eval-at-start", "false", "--scan-features", "false",
            "--threads", "1", "--draft-vocab-size", "64"]
    assert main(args) == 0
    assert main([*args, "--resume"]) == 0
    capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    config["rope_theta"] = config["rope_theta"] * 2
    (out / "config.json").write_text(json.dumps(config))
    assert main([*args, "--resume"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--resume would build another drafter (rope_theta" in err and "there," in err
