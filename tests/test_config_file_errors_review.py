"""A bad value in a `--config` TOML file is refused in one line naming the file and the key; the same
value given as a flag is not blamed on the file."""

from __future__ import annotations

import os

import pytest

from drafter_lab import cli
from drafter_lab.config import load_toml
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig

TRAIN = ["--target", "no-target", "--data", "no-data", "--out", "no-out"]  # the config is checked before these


@pytest.mark.parametrize("line, message", [
    ("hidden_size = 0", "hidden_size must be >= 1, got 0"),
    ("drift = nan", "drift must be >= 0 and finite, got nan"),
    ("vocab_size = 10", "vocab_size must be >= 259"),
])
def test_targets_build_names_the_config_file(tmp_path, capsys, line, message):
    f = tmp_path / "t.toml"
    f.write_text(line + "\n")
    assert cli.main(["targets", "build", "--config", str(f), "--out", str(tmp_path / "pair")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {f}: {message}")
    assert not (tmp_path / "pair").exists()


def test_a_bad_flag_over_a_good_file_is_not_blamed_on_the_file(tmp_path, capsys):
    f = tmp_path / "t.toml"
    f.write_text("hidden_size = 64\n")
    assert cli.main(["targets", "build", "--config", str(f), "--out", str(tmp_path / "pair"),
                     "--hidden-size", "0"]) == 2
    assert capsys.readouterr().err == "error: --hidden-size must be >= 1, got 0\n"


@pytest.mark.parametrize("line, message", [
    ("lr = -1", "lr must be >= 0 and finite, got -1.0"),
    ("lr = nan", "lr must be >= 0 and finite, got nan"),
    ("batch_size = 0", "batch_size must be >= 1 (or batch_tokens set), got 0"),
    ("seed = -1", "seed must be in [0, 2**32), got -1"),
    ("threads = 100000", f"threads must be at most {4 * (os.cpu_count() or 1)} (4 per CPU), got 100000"),
])
def test_train_names_the_config_file_that_holds_a_bad_value(tmp_path, capsys, line, message):
    f = tmp_path / "train.toml"
    f.write_text(f"[train]\n{line}\n")
    assert cli.main(["train", "--config", str(f), *TRAIN]) == 2
    assert capsys.readouterr().err == f"error: {f}: {message}\n"


def test_train_blames_a_flag_not_the_file_and_reads_both_together(tmp_path, capsys):
    f = tmp_path / "train.toml"
    f.write_text("lr = 0.001\nbatch_size = 0\n")
    assert cli.main(["train", "--config", str(f), *TRAIN, "--lr", "-1", "--batch-tokens", "256"]) == 2
    assert capsys.readouterr().err == "error: --lr must be >= 0 and finite, got -1.0\n"
    assert cli.main(["train", "--config", str(f), *TRAIN, "--batch-tokens", "256"]) == 2
    assert "batch_size" not in capsys.readouterr().err  # the flag's batch_tokens makes the file's batch_size 0 fine


def test_a_type_error_in_the_file_keeps_one_file_prefix(tmp_path):
    f = tmp_path / "train.toml"
    f.write_text('epochs = "x"\n')
    with pytest.raises(LabError) as e:
        load_toml(TrainConfig, f)
    assert str(e.value) == f"{f}: epochs: cannot read 'x' as int"
