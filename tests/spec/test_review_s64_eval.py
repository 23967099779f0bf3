"""Mutation audit (review s64) of eval: where two decodes part ways, a batch below one, the verified
tokens an eval reports (which price its accept length), pooled sets' weights and checks."""

from __future__ import annotations

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.eval import evaluate, first_difference, pool
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig


def test_a_decode_that_stops_early_differs_where_the_shorter_ends():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([1, 9, 3], [1, 2, 3]) == 1


def test_a_batch_of_zero_is_refused_before_any_work():
    """Its static batches were range(0, n, 0): a ValueError."""
    with pytest.raises(LabError, match="batch must be >= 1, got 0"):
        evaluate(None, None, [], batch=0)


@pytest.mark.parametrize("topk, draft_tokens, want", [(1, None, 3), (2, None, 6), (2, 4, 4)])
def test_an_eval_reports_the_draft_tokens_it_verified(target, conversations, topk, draft_tokens, want):
    """Not the flag as given (None): `costmodel --inputs` prices the accept length at these + 1 tokens."""
    r = evaluate(target, NgramDrafter(NgramConfig(1, 3)), conversations[:2], steps=3, topk=topk,
                 draft_tokens=draft_tokens, max_new_tokens=8)
    assert r["config"]["draft_tokens"] == want


def _set(verify_passes: int, decode_passes: int, spec_rows: float, base_rows: float, check: str) -> dict:
    return {"served_accept_len": 2.0, "verify_steps": 1, "accept_histogram": None, "verify_passes": verify_passes,
            "decode_passes": decode_passes, "live_rows_per_pass": {"spec": spec_rows, "baseline": base_rows},
            "lossless_check": check}


def test_pooled_live_rows_weigh_each_set_by_its_passes():
    """(4 x 10 + 1 x 30) / 40 rows per verify pass, not the sets' plain mean."""
    out = pool({"a": _set(10, 20, 4.0, 2.0, "identical"), "b": _set(30, 20, 1.0, 1.0, "identical")})
    assert out["live_rows_per_pass"] == {"spec": pytest.approx(1.75), "baseline": pytest.approx(1.5)}
    assert out["lossless_check"] == "identical"


def test_pooled_sets_that_checked_differently_say_which_did_what():
    skipped = "skipped: sampling (temperature > 0)"
    out = pool({"a": _set(1, 1, 1.0, 1.0, "identical"), "b": _set(1, 1, 1.0, 1.0, skipped)})
    assert out["lossless_check"] == f"a: identical; b: {skipped}"
