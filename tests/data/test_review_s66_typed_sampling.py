"""data prepare's sampling flags typed at their defaults without --regenerate are refused, as other values are."""

import pytest

from drafter_lab.cli import main


@pytest.mark.parametrize("flags", [["--temperature", "0"], ["--seed", "0"], ["--max-new-tokens", "128"]])
def test_a_sampling_flag_at_its_default_without_regenerate_is_refused(tmp_path, capsys, flags):
    """Compared by value, a flag typed at its default passed without a word though nothing is sampled."""
    assert main(["data", "prepare", "--target", "t", "--conversations", "c", "--out", str(tmp_path / "o"),
                 *flags]) == 2
    assert capsys.readouterr().err == (f"error: {flags[0]} applies with --regenerate (the target's own answers); "
                                       "without it the recorded answers are captured as they are\n")
