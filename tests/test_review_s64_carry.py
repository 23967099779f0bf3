"""Carried fixes: train() refuses a source target with remap off (only the CLI did); `vocab build` reads the
feature manifest once; `train --config` names the file for a complaint its values draw, not only for one equal
to the file's own first complaint."""

from __future__ import annotations

import pytest

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig

TRAIN = ["train", "--target", "no-target", "--data", "no-data", "--out", "no-out"]  # checked before these are read
REMAP_OFF = ("--source-target is read for the vocab remap (its tokenizer), and --no-remap turns that off: "
             "give one or the other")


def test_the_library_refuses_a_source_target_with_no_remap(tmp_path, monkeypatch):
    """train(remap=False, source_target=X) took X and never read it: silently unused."""
    from drafter_lab.train import loop

    def setup(*args, **kwargs):
        raise AssertionError("the run started: the source target should have been refused first")

    monkeypatch.setattr(loop.distributed, "setup", setup)
    with pytest.raises(LabError) as e:
        loop.train(TrainConfig(), tmp_path / "t", tmp_path / "d", tmp_path / "o", init_from=tmp_path / "src",
                   remap=False, source_target=tmp_path / "st")
    assert str(e.value) == REMAP_OFF
    assert not (tmp_path / "o").exists()


def test_vocab_build_reads_the_manifest_once(stdlib_features, tmp_path, monkeypatch, capsys):
    from drafter_lab.data.shards import Manifest

    loads = []
    load = Manifest.load.__func__

    def counted(cls, directory):
        loads.append(directory)
        return load(cls, directory)

    monkeypatch.setattr(Manifest, "load", classmethod(counted))
    assert cli.main(["vocab", "build", "--data", str(stdlib_features), "--size", "32",
                     "--out", str(tmp_path / "v.safetensors")]) == 0
    assert len(loads) == 1, loads
    assert "draft vocab 32 of" in capsys.readouterr().out


def test_count_train_tokens_takes_an_opened_feature_set(stdlib_features):
    import torch

    from drafter_lab.data.shards import FeatureSet
    from drafter_lab.data.vocab import count_train_tokens

    assert torch.equal(count_train_tokens(FeatureSet(stdlib_features)), count_train_tokens(stdlib_features))


def test_a_files_second_bad_value_names_the_file_when_a_flag_mends_its_first(tmp_path, cli_error):
    """The file's own first complaint (lr) was compared with the run's (batch_size): unequal, so the file's
    batch_size was refused naming no file and no flag."""
    f = tmp_path / "train.toml"
    f.write_text("lr = -1\nbatch_size = 0\n")
    assert cli_error([*TRAIN, "--config", str(f), "--lr", "0.1"]) == (
        f"error: {f}: batch_size must be >= 1 (or batch_tokens set), got 0")


@pytest.mark.parametrize("lines, flags, said", [
    # the flag's complaint, checked before the file's own: the flag named
    ("batch_size = 0\n", ["--lr", "-1"], "error: --lr must be >= 0 and finite, got -1.0"),
    # the file's, checked before the flag's: the file named
    ("lr = -1\n", ["--batch-size", "0"], "error: {f}: lr must be >= 0 and finite, got -1.0"),
    # nan the file and the flag both give: the file's
    ("lr = nan\n", ["--lr", "nan"], "error: {f}: lr must be >= 0 and finite, got nan"),
    # neither alone refused, the two together: the file's value is the one refused
    ('keep_best = "cond_acc_3"\n', ["--ttt-steps", "2"], "error: {f}: keep_best: 'cond_acc_3' is not a validation"),
])
def test_a_complaint_names_whose_values_draw_it(tmp_path, cli_error, lines, flags, said):
    f = tmp_path / "train.toml"
    f.write_text(lines)
    assert cli_error([*TRAIN, "--config", str(f), *flags]).startswith(said.format(f=f))
