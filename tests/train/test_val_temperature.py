"""`train --val-temperature T`: validations that also predict a sampled chain (sampled_acc_k,
sampled_accept_len), priced by `costmodel --inputs RUN --sampled`."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.data.shards import FeatureSet
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import predicted_by_steps, read_inputs
from drafter_lab.targets.hf import load_target
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics import evaluate
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, max_steps=6, batch_size=8, ttt_steps=3, lr=3e-3, warmup_steps=3,
                  log_every=1, eval_every=3, eval_batch_size=8, threads=1, max_length=96)
SAMPLED = dataclasses.replace(CFG, val_temperature=0.8, keep_best="sampled_accept_len")


def rows(out, split: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(out) if r["split"] == split]


def test_a_run_validates_a_sampled_chain_too(peaked_llama, features, tmp_path, capsys):
    train(CFG, peaked_llama, features, tmp_path / "greedy")
    final = train(SAMPLED, peaked_llama, features, tmp_path / "sampled")
    out = tmp_path / "sampled"
    # Training is untouched, and so is every greedy metric of every validation.
    assert rows(out, "train") == rows(tmp_path / "greedy", "train")
    assert not any(k.startswith("sampled") for r in rows(out, "train") for k in r)
    val = rows(out, "val")
    assert [{k: v for k, v in r.items() if not k.startswith("sampled")} for r in val] == rows(tmp_path / "greedy", "val")
    # The sampled metrics are those of `evaluate` at the temperature, on the val split.
    drafter = load_drafter(out)
    again = evaluate(drafter, load_target(peaked_llama, tokenizer=False).lm_head_weight(), FeatureSet(features).index("val"),
                     CFG.ttt_steps, CFG.eval_batch_size, max_length=CFG.max_length, temperature=0.8)
    for k in ("sampled_acc_0", "sampled_acc_2", "sampled_accept_len"):
        assert final[k] == pytest.approx(again[k], rel=1e-6, abs=1e-7), k
    assert 0 < final["sampled_accept_len"] < final["simulated_accept_len"]  # sampling accepts less here
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["metric"] == "sampled_accept_len"
    assert best["value"] == max(r["sampled_accept_len"] for r in val)
    # The cost model prices the sampled chain from the run's last validation.
    assert read_inputs(out, sampled=True)["accept_by_steps"] == predicted_by_steps(val[-1], sampled=True)
    assert read_inputs(out)["accept_by_steps"] == predicted_by_steps(val[-1])
    capsys.readouterr()
    assert main(["costmodel", "--inputs", str(out), "--sampled"]) == 0
    assert "(teacher-forced, sampled chain)" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(LabError, match="train with --val-temperature T to predict a sampled chain"):
        read_inputs(tmp_path / "greedy", sampled=True)
    assert main(["costmodel", "--sampled"]) == 2
    assert "--sampled prices a train run's sampled prediction" in capsys.readouterr().err


def test_a_run_saved_before_the_sampled_columns_resumes(peaked_llama, features, tmp_path, monkeypatch):
    cfg = dataclasses.replace(CFG, log_every=3, checkpoint_every=2)
    full = train(cfg, peaked_llama, features, tmp_path / "full")
    mid, save = {}, state.save
    monkeypatch.setattr(state, "save", lambda out, s: (mid.setdefault("s", copy.deepcopy(s)), save(out, s)))
    train(cfg, peaked_llama, features, tmp_path / "run")
    monkeypatch.undo()
    saved = mid["s"]  # step 2, between two logs: its loss counts are not yet logged
    assert saved["step"] == 2 and saved["log_counts"].any()
    del saved["config"]["val_temperature"]  # as the code before val_temperature saved it
    saved["log_counts"] = saved["log_counts"][:, :6]
    state.save(tmp_path / "run", saved)
    assert train(cfg, peaked_llama, features, tmp_path / "run", resume=True) == full
    assert rows(tmp_path / "run", "train") == rows(tmp_path / "full", "train")
    with pytest.raises(LabError, match=r"--resume with a different config \(val_temperature\)"):
        train(dataclasses.replace(cfg, val_temperature=0.8), peaked_llama, features, tmp_path / "run", resume=True)


@pytest.mark.parametrize("over, message", [
    ({"val_temperature": -1.0}, "val_temperature must be >= 0 and finite, got -1.0"),
    ({"keep_best": "sampled_accept_len"}, "'sampled_accept_len' is not a validation metric"),
    # each of these failed mid-run (at the first train line, or at the first validation after an epoch)
    ({"log_every": 0}, "log_every must be >= 1, got 0"),
    ({"eval_batch_size": 0}, "eval_batch_size must be >= 1, got 0"),
    ({"batch_size": 0}, r"batch_size must be >= 1 \(or batch_tokens set\), got 0"),
    ({"epochs": 0}, "epochs must be >= 1, got 0"),
    ({"max_steps": -1}, "max_steps must be >= 0 and finite, got -1"),
    ({"lr": -1.0}, "lr must be >= 0 and finite, got -1.0"),
    ({"loss_decay": 0.0}, "loss_decay must be a finite number > 0, got 0.0"),
    ({"min_lr_ratio": 1.5}, r"min_lr_ratio must be in \[0, 1\]"),
])
def test_bad_settings_are_refused_before_anything_is_written(peaked_llama, features, tmp_path, over, message):
    with pytest.raises(LabError, match=message):
        train(dataclasses.replace(CFG, **over), peaked_llama, features, tmp_path / "out")
    assert not (tmp_path / "out").exists()



@pytest.fixture(scope="module")
def own_tokens(peaked_llama, held_out, tmp_path_factory):
    """Held-out features of the target's own answers, sampled at SAMPLED's temperature, token for token."""
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("own_tokens")
    prepare_features(peaked_llama, held_out[0], root / "features", max_length=96, val_fraction=0.0, batch_size=16,
                     regenerate=True, token_exact=True, temperature=SAMPLED.val_temperature, max_new_tokens=48, seed=1)
    return root / "features"


def test_a_run_on_the_targets_own_tokens_replays_the_sampled_server(peaked_llama, features, own_tokens, tmp_path,
                                                                      capsys):
    out = tmp_path / "run"
    final = train(dataclasses.replace(SAMPLED, keep_best="replay_accept_len"), peaked_llama, features, out,
                  val_data=own_tokens)
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["metric"] == "replay_accept_len"
    assert best["value"] == max(r["replay_accept_len"] for r in rows(out, "val"))
    drafter = load_drafter(out)
    again = evaluate(drafter, load_target(peaked_llama, tokenizer=False).lm_head_weight(),
                     FeatureSet(own_tokens).index("train"), CFG.ttt_steps, CFG.eval_batch_size,
                     max_length=CFG.max_length, temperature=SAMPLED.val_temperature, replay=True)
    replay = [final[f"replay_accept_len_{k}"] for k in range(CFG.ttt_steps)]
    assert replay == pytest.approx([again[f"replay_accept_len_{k}"] for k in range(CFG.ttt_steps)], rel=1e-6)
    assert final["replay_accept_len"] == replay[-1]
    assert 1 < replay[0] < replay[1] < replay[2] < 1 + CFG.ttt_steps  # deeper chains emit more per verify step
    # The cost model prices the replay, not the position average, for a sampled server.
    assert read_inputs(out, sampled=True)["accept_by_steps"] == replay
    assert read_inputs(out)["accept_by_steps"] == predicted_by_steps(final)
    capsys.readouterr()
    assert main(["costmodel", "--inputs", str(out), "--sampled"]) == 0
    assert "(teacher-forced, sampled chain, replayed over the target's own tokens)" in \
        " ".join(capsys.readouterr().err.split())
    # At another temperature than the tokens were sampled at, or on text tokenized again, no replay.
    other = train(dataclasses.replace(SAMPLED, val_temperature=0.5), peaked_llama, features, tmp_path / "other",
                  val_data=own_tokens)
    assert "sampled_accept_len" in other and not any(k.startswith("replay") for k in other)
    err = " ".join(capsys.readouterr().err.split())
    assert "no replay_accept_len_k at temperature 0.5: the validation text was sampled at temperature 0.8" in err
    with pytest.raises(LabError, match="keep_best: 'replay_accept_len' needs validation text of the target's own"):
        train(dataclasses.replace(SAMPLED, keep_best="replay_accept_len"), peaked_llama, features, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    with pytest.raises(LabError, match="the replay needs the temperature the target's tokens were sampled at"):
        evaluate(drafter, load_target(peaked_llama, tokenizer=False).lm_head_weight(),
                 FeatureSet(own_tokens).index("train"), CFG.ttt_steps, replay=True)
