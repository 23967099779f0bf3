"""Sampling at a temperature near 0: the T -> 0 limit (the argmax), not NaN probabilities."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.ngram_config import NgramConfig
from drafter_lab.spec.sampling import probs_from_logits

from .conftest import make_drafter
from .test_sampling import _tiny_target


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-300])
def test_probs_at_a_tiny_temperature_are_the_argmax(temperature):
    logits = torch.tensor([[30.0, 29.0, -5.0], [-0.5, -2.0, -9.0]])
    assert torch.equal(probs_from_logits(logits, temperature), torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))


@pytest.mark.parametrize("kind, mode", [("eagle", dict(steps=3, topk=1)), ("eagle", dict(steps=2, topk=2)),
                                        ("ngram", dict(steps=3, topk=1))], ids=["chain", "tree", "ngram"])
def test_decoding_at_a_tiny_temperature_is_greedy_decoding(tmp_path, kind, mode):
    """Was torch.multinomial's traceback (logits / T overflowed fp32 to inf, softmax gave NaN)."""
    target = _tiny_target(tmp_path)
    drafter = make_drafter(target, seed=5) if kind == "eagle" else NgramDrafter(NgramConfig(1, 2))
    prompts = [[3, 7, 1, 4], [2, 2, 5]]
    greedy = SpecEngine(target, drafter, SpecConfig(max_new_tokens=10, stop_at_eos=False, **mode))
    want = greedy.generate(prompts, speculative=False).tokens
    cold = SpecEngine(target, drafter, SpecConfig(temperature=1e-40, max_new_tokens=10, stop_at_eos=False, **mode))
    for speculative in (False, True):
        got = cold.generate(prompts, speculative=speculative, generator=torch.Generator().manual_seed(0))
        assert got.tokens == want


@pytest.mark.parametrize("speculative", [False, True])
def test_a_pad_id_past_the_embeddings_pads_with_one_inside(tmp_path, speculative):
    """A tokenizer's <pad> added without resizing the embeddings: prompts of unequal length were
    padded with it, an IndexError in the target's embedding."""
    from types import SimpleNamespace

    target = _tiny_target(tmp_path)
    drafter = NgramDrafter(NgramConfig(1, 2))
    cfg = SpecConfig(max_new_tokens=6, stop_at_eos=False, steps=2, topk=2, draft_tokens=3)
    prompts = [[3, 7, 1, 4], [2, 5]]
    want = SpecEngine(target, drafter, cfg).generate(prompts, speculative=speculative).tokens
    target.tokenizer = SimpleNamespace(pad_token_id=12)
    assert SpecEngine(target, drafter, cfg).generate(prompts, speculative=speculative).tokens == want
