"""vLLM's per-position acceptance counters, read before and after an eval."""

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec import served


def _vllm(before: dict, after: dict) -> served.VLLM:
    server = served.VLLM("http://127.0.0.1:9", served.ServedConfig(url="http://127.0.0.1:9", model="m"))
    server.before = before
    server._counters = lambda: after
    return server


ANSWERS = [served.Answer([1, 2, 3], 3, {}, 0.1, 0.2, 2)]


@pytest.mark.parametrize("after_per_pos", [{0: 6.0, 1: 9.0}, {0: 16.0}], ids=["went-back", "gone"])
def test_a_per_position_counter_that_went_back_is_refused(after_per_pos):
    """The totals grew, but position 0 counted fewer accepted drafts than before (or position 1 vanished):
    the histogram would hold a negative count of steps."""
    before = {"drafts": 10.0, "accepted": 20.0, "per_pos": {0: 8.0, 1: 5.0}}
    after = {"drafts": 20.0, "accepted": 32.0, "per_pos": after_per_pos}
    with pytest.raises(LabError, match="went back during the eval"):
        _vllm(before, after).acceptance(ANSWERS)


def test_a_position_first_counted_during_the_eval_counts_from_zero():
    """A position the server had not counted before the eval (absent from the first read) starts at 0."""
    before = {"drafts": 10.0, "accepted": 8.0, "per_pos": {0: 8.0}}
    after = {"drafts": 20.0, "accepted": 20.0, "per_pos": {0: 16.0, 1: 4.0}}
    assert _vllm(before, after).acceptance(ANSWERS) == (pytest.approx(2.2), 10, {"1": 2, "2": 4, "3": 4})
