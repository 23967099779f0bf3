"""`train --config`: a bad value the file holds is one line naming the file, for every TrainConfig field the
run checks on its own (not only those check_config counted)."""

from __future__ import annotations

from drafter_lab.cli import main


def test_a_keep_best_that_is_no_metric_names_the_config_file(tmp_path, capsys):
    """keep_best was checked by the run, after the other settings: its line named no file. Nothing is read
    either way (the target and data paths do not exist)."""
    path = tmp_path / "run.toml"
    path.write_text('[train]\nkeep_best = "accept_len"\nttt_steps = 2\n')
    code = main(["train", "--target", str(tmp_path / "t"), "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                 "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}: keep_best: 'accept_len' is not a validation metric; one of loss_0, "), err
    assert "cond_acc_1, simulated_accept_len" in err and "cond_acc_2" not in err
    # The same value from the flag is the flag's: no file named.
    code = main(["train", "--target", str(tmp_path / "t"), "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
                 "--keep-best", "accept_len"])
    assert code == 2 and capsys.readouterr().err.startswith("error: --keep-best: 'accept_len' is not a validation metric")
    assert not (tmp_path / "o").exists()
