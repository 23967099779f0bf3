"""Review (s75, h6): a cost-model input's request rate is checked as `eval` sets it, a chain eval's histogram
prices the depth it ran at, and `check_positions` admits a one-token run that fits the target."""

from __future__ import annotations

import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.spec.costinputs import accept_by_steps, apply_inputs
from drafter_lab.spec.costmodel import PRESETS
from drafter_lab.spec.engine import SpecConfig, SpecEngine

SEEDS = PRESETS["seeds-kimi-k2.5-8x-pcie"]


def _inputs(tmp_path, data):
    f = tmp_path / "eval.json"
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize("rate", [0, -2.0, float("nan"), float("inf"), "fast", True, [2.0]])
def test_a_request_rate_no_eval_runs_at_is_one_line_naming_the_file(tmp_path, rate):
    """Unchecked, any rate but null switched the batch to in_flight.spec and priced the eval as served at it."""
    f = _inputs(tmp_path, {"served_accept_len": 2.0, "in_flight": {"spec": 3.0},
                           "config": {"steps": 3, "topk": 1, "request_rate": rate}})
    with pytest.raises(LabError) as e:
        apply_inputs(SEEDS, f)
    assert str(e.value) == f"{f}: config.request_rate must be a positive number of requests per second, got {rate!r}"


def test_a_sweep_rows_request_rate_is_checked_too(tmp_path):
    row = {"served_accept_len": 2.0, "in_flight": {"spec": 3.0}, "config": {"steps": 3, "request_rate": -1}}
    f = _inputs(tmp_path, {"sweep": [row]})
    with pytest.raises(LabError, match=r"config.request_rate must be a positive number .*, got -1$"):
        apply_inputs(SEEDS, f)


def test_a_positive_request_rate_prices_the_requests_in_flight(tmp_path):
    f = _inputs(tmp_path, {"served_accept_len": 2.0, "in_flight": {"spec": 3.4},
                           "config": {"steps": 3, "topk": 1, "request_rate": 0.5}})
    assert apply_inputs(SEEDS, f)[0].batch == 3


def test_a_length_listed_with_no_steps_reaches_the_depth_the_eval_ran_at():
    """`eval` lists every length 1..steps+1 (accept.accept_summary), counts of 0 included: at 4 steps
    where no step accepted more than 1 draft, the table still prices depths 1..4 (flat past 1), the eval's
    own depth among them, and a length it did not list adds no depth."""
    assert accept_by_steps({"1": 2, "2": 2, "3": 0, "4": 0, "5": 0}, None, 4) == [1.5] * 4
    assert accept_by_steps({"1": 2, "2": 2}, None, 4) == [1.5]


def test_one_new_token_takes_no_position_past_the_prompt(target, random_drafter, prompts):
    """max_new_tokens 1 is the prefill's token: nothing is verified or drafted. The bound added `steps`
    all the same, refusing a prompt that fits (here by 4 positions)."""
    longest = max(map(len, prompts))
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=4, max_new_tokens=1, stop_at_eos=False))
    engine.max_positions = longest  # positions 0..longest-1: the longest prompt fits exactly
    engine.check_positions(prompts)
    gen = engine.generate(prompts)
    assert [len(t) for t in gen.tokens] == [1] * len(prompts) and gen.verify_passes == 0
    assert gen.tokens == engine.generate(prompts, speculative=False).tokens
    engine.max_positions = longest - 1
    with pytest.raises(LabError) as e:
        engine.check_positions(prompts)
    assert str(e.value) == (f"max_new_tokens 1 takes the longest prompt ({longest} tokens) to position {longest - 1}, "
                            f"past the target's max_position_embeddings {longest - 1}")


def test_two_new_tokens_still_draft_past_the_prompt(target, random_drafter):
    """From 2 tokens on, one verify step runs with its drafts: the bound is the prompt, the root and `steps`."""
    engine = SpecEngine(target, random_drafter, SpecConfig(steps=4, max_new_tokens=2))
    engine.max_positions = 10 + 2 + 4 - 2
    with pytest.raises(LabError, match=r"^steps 4 with max_new_tokens 2 takes the longest prompt \(10 tokens\) "
                                       r"to position 14, "):
        engine.check_positions([[1] * 10])
