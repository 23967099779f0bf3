"""`train --config` (and the probe's --pilot-config): a [train] table leaves nothing else at top level."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.train.commands import load_config


def test_top_level_keys_beside_a_train_table_are_refused(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text("batch_size = 3\n[train]\nlr = 0.5\n")
    with pytest.raises(LabError, match=f"^{path}: key\\(s\\) batch_size outside the \\[train\\] table"):
        load_config(path)
    path.write_text("batch_size = 3\nlr = 0.5\n")
    assert (load_config(path).batch_size, load_config(path).lr) == (3, 0.5)


def test_an_unreadable_config_is_one_line_naming_it(tmp_path):
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(LabError, match=f"^{tmp_path / 'bin.toml'}: not valid TOML"):
        load_config(tmp_path / "bin.toml")
    with pytest.raises(LabError, match=f"^{tmp_path}: cannot read"):
        load_config(tmp_path)


@pytest.mark.parametrize("rank, lines", [("0", 1), ("1", 0)])
def test_only_rank_0_prints_the_result(monkeypatch, capsys, tmp_path, rank, lines):
    """Under torchrun every rank returns the final metrics: a script reading stdout gets them once."""
    from drafter_lab.cli import main
    from drafter_lab.train import loop

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(loop, "train", lambda *a, **k: {"step": 11, "loss_0": 1.0})
    assert main(["train", "--target", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.count('"step": 11') == lines

