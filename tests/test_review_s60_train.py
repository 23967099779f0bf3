"""Review s60, train: the drafter's head_dim from a draft config (and a resume of a run from before it),
drafter_rope_scaling and device refused naming the --config file, weighted_loss over the steps that scored."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError
from drafter_lab.train import state
from drafter_lab.train.config import UNKEYED_DEFAULTS, TrainConfig, check_config
from drafter_lab.train.loop import _drafter_config

# Qwen3-style: heads x head_dim (4 x 32) is not the hidden size (64).
TARGET = SimpleNamespace(config=SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=32, intermediate_size=128, vocab_size=300,
                                                max_position_embeddings=256, rope_theta=1e4))


def _head_dim(**fields) -> int:
    return _drafter_config(TrainConfig(**fields), TARGET, 32, [1, 2, 3]).head_dim


def test_the_drafter_takes_the_head_dim_given():
    """Was hidden / heads (or the target's) whatever drafter_head_dim said, as a --draft-config's head_dim
    was never read: a drafter of hidden 32 and 2 heads of 32 came out with heads of 16."""
    assert _head_dim(drafter_hidden_size=32, drafter_heads=2, drafter_kv_heads=1, drafter_head_dim=32) == 32
    assert _head_dim(drafter_hidden_size=32, drafter_heads=2, drafter_kv_heads=1) == 16
    assert _head_dim(drafter_head_dim=8) == 8  # alone, with every other field at the target's
    assert _head_dim() == _head_dim(drafter_intermediate_size=96) == 32  # the target's, as before
    # heads that do not divide the hidden size need the head_dim given
    assert _head_dim(drafter_hidden_size=36, drafter_heads=8, drafter_head_dim=4) == 4
    with pytest.raises(LabError, match="hidden 36 must divide by heads 8"):
        _head_dim(drafter_hidden_size=36, drafter_heads=8)


def test_a_head_dim_its_default_gives_is_recorded_as_zero():
    """So that a run from before the field (recorded without it: UNKEYED_DEFAULTS's 0) resumes when a
    --draft-config or the pilot now sets the head_dim it had."""
    from drafter_lab.train.loop import settled

    tc = TARGET.config
    assert UNKEYED_DEFAULTS["drafter_head_dim"] == TrainConfig().drafter_head_dim == 0
    assert settled(TrainConfig(drafter_head_dim=32), tc).drafter_head_dim == 0  # the target's
    assert settled(TrainConfig(drafter_head_dim=16), tc).drafter_head_dim == 16
    narrow = TrainConfig(drafter_hidden_size=32, drafter_heads=2)
    assert settled(TrainConfig(**{**narrow.__dict__, "drafter_head_dim": 16}), tc).drafter_head_dim == 0
    assert settled(TrainConfig(**{**narrow.__dict__, "drafter_head_dim": 32}), tc).drafter_head_dim == 32


def test_an_odd_or_negative_head_dim_is_refused_before_the_run():
    with pytest.raises(LabError, match="drafter_head_dim 15 is odd"):
        check_config(TrainConfig(drafter_head_dim=15))
    with pytest.raises(LabError, match="drafter_head_dim must be >= 0"):
        check_config(TrainConfig(drafter_head_dim=-2))


def test_the_pilot_keeps_the_source_drafters_head_dim():
    from drafter_lab.experiments.pilot import pilot_config

    source = DrafterConfig(hidden_size=32, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=32, draft_vocab_size=100, target_vocab_size=300, target_hidden_size=64)
    cfg = pilot_config(TrainConfig(), 8, source)
    assert (cfg.drafter_hidden_size, cfg.drafter_heads, cfg.drafter_head_dim) == (32, 2, 32)


def _cli_error(capsys, *argv) -> str:
    assert main(["train", "--target", "no-target", "--data", "no-data", "--out", "no-out", *argv]) == 2
    return " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("line, said", [
    ('drafter_rope_scaling = "{llama3"', "drafter_rope_scaling: rope scaling is not JSON"),
    ('drafter_rope_scaling = \'{"rope_type": "yarn"}\'', "drafter_rope_scaling: RoPE scaling 'yarn' is not supported"),
    ('device = "gpu"', "unknown device 'gpu': use auto, cpu, cuda or cuda:N"),
    ("drafter_head_dim = 15", "drafter_head_dim 15 is odd"),
])
def test_a_bad_value_in_the_config_file_names_the_file(tmp_path, capsys, line, said):
    """Was refused only where the run built its drafter or picked its device: naming the flag
    (--drafter-rope-scaling), or nothing, after the target was loaded."""
    toml = tmp_path / "train.toml"
    toml.write_text(f"[train]\n{line}\n")
    assert f"{toml}: {said}" in _cli_error(capsys, "--config", str(toml))


def test_a_bad_flag_is_named_as_given(capsys):
    assert "error: --drafter-rope-scaling: rope scaling is not JSON" in _cli_error(
        capsys, "--drafter-rope-scaling", "{llama3")
    assert "error: unknown device 'gpu'" in _cli_error(capsys, "--device", "gpu")


def test_weighted_loss_counts_the_steps_that_scored():
    """Was NaN wherever one step scored no position (a validation set too short to reach the last step),
    at every validation of the run: keep_best = "weighted_loss" kept nothing, silently, and the watch on it
    matched nothing. The TTT objective adds nothing for such a step (its denominator clamps at 1)."""
    from drafter_lab.train.metrics import summarize, weighted_loss
    from drafter_lab.train.ttt import CE_SUM, N_COLS, N_LOSS, N_VALID

    counts = torch.zeros(3, N_COLS)
    counts[0, [CE_SUM, N_LOSS, N_VALID]] = torch.tensor([6.0, 3.0, 3.0])
    counts[1, [CE_SUM, N_LOSS, N_VALID]] = torch.tensor([5.0, 2.0, 2.0])
    m = summarize(counts)
    assert math.isnan(m["loss_2"])
    assert weighted_loss(m, 3, 0.8) == pytest.approx(2.0 + 0.8 * 2.5)
    assert math.isnan(weighted_loss(summarize(torch.zeros(3, N_COLS)), 3, 0.8))  # nothing scored: nothing measured


# ---- end to end: --draft-config on a real (random) target ----------------------------------------------

def _draft_config(path: Path, target_dir: Path, **over) -> Path:
    target = json.loads((target_dir / "config.json").read_text())
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": 32, "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": target["vocab_size"], "draft_vocab_size": 100,
        "rope_theta": target.get("rope_theta") or target["rope_parameters"]["rope_theta"], "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False, **over}))
    return path


def _train(target, features, out, *extra) -> int:
    return main(["train", "--target", str(target), "--data", str(features), "--out", str(out), "--max-steps", "1",
                 "--batch-size", "4", "--eval-every", "0", "--scan-features", "false", "--threads", "1", *extra])


def test_a_draft_configs_head_dim_is_trained(random_llama, stdlib_features, tmp_path):
    cfg = _draft_config(tmp_path / "eagle3.json", random_llama, head_dim=32)  # 2 heads of 32 at hidden 32
    assert _train(random_llama, stdlib_features, tmp_path / "a", "--draft-config", str(cfg)) == 0
    made = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (made["hidden_size"], made["num_attention_heads"], made["head_dim"]) == (32, 2, 32)


def test_a_run_from_before_the_field_resumes_with_its_draft_config(random_llama, stdlib_features, tmp_path):
    """Its saved config has no drafter_head_dim; --draft-config now sets the head_dim it was built with,
    which the run records as 0, so the resume finds the same config (else: refused, drafter_head_dim)."""
    cfg = _draft_config(tmp_path / "eagle3.json", random_llama, head_dim=16)
    out = tmp_path / "old"
    assert _train(random_llama, stdlib_features, out, "--draft-config", str(cfg)) == 0
    saved = state.load(out)
    del saved["config"]["drafter_head_dim"]
    state.save(out, saved)  # as a run from before the field saved it
    assert _train(random_llama, stdlib_features, out, "--draft-config", str(cfg), "--resume") == 0
    assert json.loads((out / "run.json").read_text())["config"]["drafter_head_dim"] == 0
