"""train's online and watch flags count when typed, at their defaults too, and the refusal names those typed."""

import pytest

from drafter_lab.cli import main


def _error(capsys, *argv) -> str:
    assert main(["train", "--target", "t", "--out", "o", *argv]) == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("flags", [["--val-fraction", "0.05"], ["--turns", "all"], ["--target-dtype", "float32"],
                                   ["--tokenize-workers", "1"]])
def test_an_online_flag_at_its_default_on_a_features_run_is_refused(trained, capsys, flags):
    """Compared by value, a flag typed at its default passed on a features run without a word."""
    assert _error(capsys, "--data", "d", *flags) == f"error: {flags[0]} applies to --conversations (online) runs only"
    assert trained == []


def test_the_refusal_names_the_flags_typed(trained, capsys):
    assert _error(capsys, "--data", "d", "--turns", "last", "--token-exact") == (
        "error: --token-exact and --turns apply to --conversations (online) runs only")


def test_a_watch_flag_at_its_default_without_stop_if_behind_is_refused(trained, capsys):
    assert _error(capsys, "--data", "d", "--watch-window", "3") == (
        "error: --watch-window applies with --stop-if-behind only")
    assert trained == []
