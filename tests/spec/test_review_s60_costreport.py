"""The cost report writes microseconds as a table reads them: never in exponent form."""

from __future__ import annotations

import pytest

from drafter_lab.cli import main
from drafter_lab.spec.costmodel import us_text


@pytest.mark.parametrize("us, text", [(1280.4, "1280"), (99.96, "100"), (99.94, "99.9"), (12.345, "12.3"),
                                      (5.17, "5.17"), (0.5, "0.5")])
def test_three_significant_figures_without_an_exponent(us, text):
    assert us_text(us) == text


def test_a_slow_all_reduce_and_draft_step_read_in_plain_microseconds(capsys):
    assert main(["costmodel", "--verify-allreduce-us", "1500", "--draft-step-us", "1234.4"]) == 0
    text = capsys.readouterr().out
    assert "e+0" not in text
    assert "122 all-reduces x 1500 us" in text
    assert "steps x 1234 us" in text


def test_a_verify_step_without_all_reduces_prints_no_what_if_rows(capsys):
    """Each row priced another latency of no all-reduce: five identical rows."""
    assert main(["costmodel", "--allreduces-per-layer", "0"]) == 0
    text = capsys.readouterr().out
    assert "what-if: none (no all-reduce in the verify step" in text
    assert "200 us" not in text and "verify message" not in text
