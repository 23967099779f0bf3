"""A served eval is priced at the requests it carried, whether or not the server said its draft steps."""

from __future__ import annotations

import pytest

from drafter_lab.spec.costinputs import drafting
from drafter_lab.spec.costmodel import CostModelConfig


def _served(steps):
    return {"served_accept_len": 2.5, "accept_histogram": None, "in_flight": {"spec": 12.4, "baseline": None},
            "config": {"steps": steps, "topk": None if steps is None else 1, "draft_tokens": None,
                       "concurrency": 16, "request_rate": None}}


@pytest.mark.parametrize("steps", [3, None], ids=["said", "unsaid"])
def test_a_served_eval_is_priced_at_its_concurrency(steps):
    """A vLLM server that reports no draft steps kept the preset's steps, and so its batch too: 16
    requests in flight were priced as one."""
    preset = CostModelConfig()
    cfg = drafting(preset, _served(steps), "eval.json")
    assert cfg.batch == 16
    assert cfg.steps == (preset.steps if steps is None else 3)
