"""Config input that ended in a traceback or was silently changed: one line naming the file and key instead."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from drafter_lab import cli
from drafter_lab.config import from_dict, load_toml
from drafter_lab.errors import LabError
from drafter_lab.experiments.reproduce import recorded_config
from drafter_lab.train.config import TrainConfig


@dataclass
class Named:
    name: str
    """Required."""
    levels: list[float] = field(default_factory=list)
    """Levels."""
    arms: list[str] = field(default_factory=list)
    """Arms."""


def test_a_missing_required_key_is_one_line_naming_the_source(tmp_path):
    """from_dict passed the keys on to the class, whose TypeError ended `reproduce` of a manifest without a name."""
    with pytest.raises(LabError, match="^src: missing config key\\(s\\) name$"):
        from_dict(Named, {"levels": [1.0]}, "src")
    manifest = tmp_path / "manifest.json"
    with pytest.raises(LabError, match=f"^{manifest}: config: missing config key\\(s\\) name$"):
        recorded_config({"config": {"drift_levels": [1.0]}}, tmp_path)


def test_an_empty_string_in_a_typed_list_is_refused_or_kept_not_dropped():
    """`drift_levels = [1.0, ""]` loaded as [1.0], `arms = ["a", ""]` as ["a"]: a value dropped without a word."""
    with pytest.raises(LabError, match="^src: levels: cannot read '' as float$"):
        from_dict(Named, {"name": "x", "levels": [1.0, ""]}, "src")
    assert from_dict(Named, {"name": "x", "arms": ["a", ""]}, "src").arms == ["a", ""]  # for the config to judge


def test_an_integer_too_large_for_a_float_field_is_refused(tmp_path, capsys):
    """`lr = 1000...0` (309+ digits) ended `train --config` in an OverflowError traceback."""
    path = tmp_path / "c.toml"
    path.write_text("lr = 1" + "0" * 400 + "\n")
    with pytest.raises(LabError, match=f"^{path}: lr: cannot read 1000+ as float$"):
        load_toml(TrainConfig, path, section="train")
    assert cli.main(["train", "--target", "t", "--data", "d", "--out", str(tmp_path / "o"), "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}: lr: cannot read 1000")


def test_an_integer_past_pythons_digit_limit_is_not_valid_toml(tmp_path):
    """tomllib raises a plain ValueError (not a TOMLDecodeError) for an integer of over 4300 digits."""
    path = tmp_path / "c.toml"
    path.write_text("batch_size = 1" + "0" * 5000 + "\n")
    with pytest.raises(LabError, match=f"^{path}: not valid TOML: Exceeds the limit"):
        load_toml(TrainConfig, path, section="train")


def test_train_flags_override_the_file_and_the_file_overrides_the_defaults(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nlr = 0.5\nbatch_size = 4\nkeep_best = 'cond_acc_0'\n")
    seen = {}

    def fake_train(cfg, *args, **kwargs):
        seen["cfg"] = cfg
        return {"step": 0}

    monkeypatch.setattr("drafter_lab.train.loop.train", fake_train)
    assert cli.main(["train", "--target", "t", "--data", "d", "--out", str(tmp_path / "o"), "--config", str(path),
                     "--batch-size", "2", "--keep-best", ""]) == 0
    cfg = seen["cfg"]
    assert (cfg.lr, cfg.batch_size, cfg.keep_best, cfg.epochs) == (0.5, 2, "", TrainConfig().epochs)


@pytest.mark.parametrize("argv", [[], ["no-such-command"]])
def test_no_command_or_an_unknown_one_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "COMMAND" in capsys.readouterr().err


def test_a_bad_manifest_config_value_names_the_manifest(tmp_path):
    with pytest.raises(LabError, match=f"^{tmp_path / 'manifest.json'}: config: batch_size: cannot read 2.5 as int$"):
        recorded_config({"config": {"name": "x", "batch_size": 2.5}}, tmp_path)


@pytest.mark.parametrize("argv", [
    ["train", "--target", "t", "--data", "d", "--out", "o", "--config", ""],
    ["probe", "--drafter", "d", "--target", "t", "--data", "f", "--pilot-config", ""],
    ["targets", "build", "--out", "o", "--config", ""],
])
def test_an_empty_config_path_is_refused_not_read_as_no_file(argv, tmp_path, monkeypatch, capsys):
    """An unset $CFG in `--config "$CFG"` trained (or built) quietly with the defaults."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    assert f"error: argument {argv[-2]}: empty: name a file or directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_toml_file_saved_with_a_bom_reads_as_without(tmp_path):
    """Some editors (older Windows Notepad) start UTF-8 with a BOM, which tomllib refused at line 1."""
    f = tmp_path / "c.toml"
    f.write_bytes(b"\xef\xbb\xbf" + b"batch_size = 3\n")
    assert load_toml(TrainConfig, f).batch_size == 3
