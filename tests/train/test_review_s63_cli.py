"""Review s63: `train --source-target` with `--no-remap` is refused (the remap that reads it is off); a
--source-target with other weights than the source drafter's run records is refused before the features'
scan; and a setting refused by the config checks names the flag typed, not the field (a --config file's
own value keeps naming the file and field), in train, watch, probe and data prepare."""

from __future__ import annotations

import pytest

from drafter_lab import config as labconfig
from drafter_lab.errors import LabError
from drafter_lab.train import sources
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=64, max_steps=1, batch_size=8, ttt_steps=2, log_every=1, eval_every=1,
                  eval_batch_size=8, threads=1, max_length=64)



def test_source_target_with_no_remap_is_refused(tmp_path, no_training, cli_error):
    """--no-remap copies lm_head rows by id, so --source-target's tokenizer was never read: silently unused."""
    argv = ["train", "--target", str(tmp_path / "t"), "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
            "--init-from", str(tmp_path / "src"), "--no-remap", "--source-target", str(tmp_path / "st")]
    assert cli_error(argv) == ("error: --source-target is read for the vocab remap (its tokenizer), and "
                                  "--no-remap turns that off: give one or the other")
    assert not (tmp_path / "o").exists()


def test_another_source_target_is_refused_before_the_scan(random_llama, stdlib_features, tmp_path, monkeypatch,
                                                          foreign_source_target):
    """check_source_target ran in source_tokens, after the features' scan (minutes on a real set)."""
    drafter, other = foreign_source_target

    def scan(*args, **kwargs):
        raise AssertionError("the features were scanned before --source-target was checked")

    monkeypatch.setattr(sources, "_scan", scan)
    with pytest.raises(LabError, match=f"--source-target {other} is not the target this drafter was trained on"):
        train(CFG, random_llama, stdlib_features, tmp_path / "run", init_from=drafter, source_target=other)
    assert not (tmp_path / "run").exists()


TRAIN = ["train", "--target", "no-target", "--data", "no-data", "--out", "no-out"]  # checked before these are read
ONLINE = ["train", "--target", "no-target", "--conversations", "no.jsonl", "--out", "no-out"]


@pytest.mark.parametrize("argv, message", [
    ([*ONLINE, "--val-fraction", "1.5"], "--val-fraction must be in [0, 1), got 1.5"),
    ([*ONLINE, "--tokenize-workers", "0"], "--tokenize-workers must be at least 1, got 0"),
    ([*TRAIN, "--lr", "-1"], "--lr must be >= 0 and finite, got -1.0"),
    ([*TRAIN, "--batch-size", "x"], "--batch-size: cannot read 'x' as int"),
    ([*TRAIN, "--min-lr-ratio", "2"], "--min-lr-ratio must be in [0, 1] and adam_beta2 in [0, 1), got 2.0 and 0.95"),
    ([*TRAIN, "--drafter-head-dim", "3"], "--drafter-head-dim 3 is odd: RoPE rotates the two halves of each head"),
    ([*TRAIN, "--drafter-rope-scaling", "{"], "--drafter-rope-scaling: rope scaling is not JSON: '{'"),
    ([*TRAIN, "--init-from", "no-src", "--l2sp", "-1"],
     "--l2sp and --transfer-lr-scale must be >= 0, got -1.0 and 1.0"),
    # the watch's settings before its baseline is read (there is none here)
    ([*TRAIN, "--stop-if-behind", "no-run", "--watch-window", "0"], "--watch-window must be >= 1, got 0"),
    ([*TRAIN, "--stop-if-behind", "no-run", "--watch-axis", "epoch"],
     "--watch-axis must be one of step, train_tokens, got 'epoch'"),
    ([*TRAIN, "--stop-if-behind", "no-run", "--watch-metric", "acc"], "--watch-metric: 'acc' is not a validation metric"),
    (["watch", "no-run", "--baseline", "no-base", "--watch-margin", "nan"], "--watch-margin must be >= 0, got nan"),
    (["probe", "--drafter", "d", "--target", "t", "--data", "f", "--cka-tokens", "1"],
     "--cka-tokens must be >= 2, got 1"),
    (["data", "prepare", "--target", "t", "--conversations", "c", "--out", "o", "--val-fraction", "1.5"],
     "--val-fraction must be in [0, 1), got 1.5"),
    (["data", "prepare", "--target", "t", "--conversations", "c", "--out", "o", "--regenerate", "--temperature", "-1"],
     "--temperature must be a finite number >= 0, got -1.0"),
])
def test_a_refused_setting_names_the_flag_typed(tmp_path, monkeypatch, no_training, argv, message, cli_error):
    monkeypatch.chdir(tmp_path)
    assert cli_error(argv).startswith(f"error: {message}")


def test_a_config_files_own_value_names_the_file_and_field(tmp_path, no_training, cli_error):
    f = tmp_path / "train.toml"
    f.write_text("min_lr_ratio = 2\n")
    assert cli_error([*TRAIN, "--config", str(f), "--lr", "0.1"]) == (
        f"error: {f}: min_lr_ratio must be in [0, 1] and adam_beta2 in [0, 1), got 2.0 and 0.95")
    # the flag's value over the file's good one: the flag named, the file's field as the file spells it
    f.write_text("adam_beta2 = 0.9\n")
    assert cli_error([*TRAIN, "--config", str(f), "--min-lr-ratio", "2"]) == (
        "error: --min-lr-ratio must be in [0, 1] and adam_beta2 in [0, 1), got 2.0 and 0.9")


@pytest.mark.parametrize("said, flags, named", [
    ("device 'cuda:7': no CUDA device is visible", {"device": "--device"},
     "--device 'cuda:7': no CUDA device is visible"),  # a one-word name only where it begins the message
    ("keep_best: 'val_fraction' is not a metric; one of loss_0, keep_best_x", {"keep_best": "--keep-best",
                                                                             "val_fraction": "--val-fraction"},
     "--keep-best: 'val_fraction' is not a metric; one of loss_0, keep_best_x"),  # not in a value or longer name
    ("batch_size must be >= 1 (or batch_tokens set), got 0", {"batch_tokens": "--batch-tokens"},
     "batch_size must be >= 1 (or --batch-tokens set), got 0"),
])
def test_flags_named_rewrites_whole_field_names_only(said, flags, named):
    with pytest.raises(LabError) as e, labconfig.flags_named(flags):
        raise LabError(said)
    assert str(e.value) == named


def test_flags_named_leaves_an_error_naming_a_file(tmp_path):
    with pytest.raises(LabError) as e, labconfig.flags_named({"lr": "--lr"}):
        raise LabError("lr must be >= 0", tmp_path / "run.toml")
    assert str(e.value) == f"{tmp_path / 'run.toml'}: lr must be >= 0" and e.value.path == str(tmp_path / "run.toml")

