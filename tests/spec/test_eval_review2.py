"""`eval`: --draft-tokens where only chains are drafted, and a drafter whose aux layers repeat or are out of
order."""

from __future__ import annotations

import dataclasses
import re

import pytest

from drafter_lab import cli
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.spec.sweep import grid


@pytest.mark.parametrize("steps, draft_tokens, sglang", [([2, 4], [8], "steps + 1"), ([4], [4, 8], "5"),
                                                        ([4], [5], "5"), ([2, 4], [2, 4], "steps + 1")])
def test_draft_tokens_with_chains_alone_are_refused(steps, draft_tokens, sglang):
    """A sweep of chains dropped the list without a word."""
    with pytest.raises(LabError, match=rf"a chain verifies the .* tokens it drafts, its --steps \(SGLang's "
                                       rf"--speculative-num-draft-tokens {re.escape(sglang)}, the root included\)"):
        grid(steps, [1], draft_tokens)
    # what applies is kept: a chain's own count, and a list beside a tree
    assert [g["draft_tokens"] for g in grid([4], [1], [4])] == [4]
    assert [(g["topk"], g["draft_tokens"]) for g in grid([4], [1, 2], [6])] == [(1, 4), (2, 6)]


def test_eval_refuses_them_before_loading_anything(prompts_file, tmp_path, capsys):
    missing = tmp_path / "no-target"
    assert cli.main(["eval", "--ngram", "--target", str(missing), "--prompts", str(prompts_file),
                     "--steps", "2,4", "--draft-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a chain verifies the 2 or 4 tokens it drafts") and err.count("\n") == 0


@pytest.mark.parametrize("ids, error", [
    ([2, 2, 5], "aux layer ids #1 and #2 name the same layer: EAGLE-3 fuses the hidden states of three distinct layers"),
    ([5, 2, 4], "aux layer ids [5, 2, 4] are not in layer order: SGLang and vLLM hand the drafter's fc the states in "
                "layer order ([2, 4, 5]), so give them ascending"),
])
def test_a_drafter_whose_aux_layers_repeat_or_are_out_of_order_is_refused(ids, error, random_llama, random_drafter,
                                                                          prompts_file, tmp_path, capsys):
    """It decoded, fusing one layer's features twice, or reading its config's list in an order engines do not serve."""
    cfg = dataclasses.replace(random_drafter.config, aux_layer_ids=ids)
    d = Eagle3Drafter(cfg)
    d.load_state_dict(random_drafter.state_dict())
    drafter = save_drafter(d, tmp_path / "drafter")
    assert cli.main(["eval", "--drafter", str(drafter), "--target", str(random_llama), "--prompts", str(prompts_file),
                     "--max-new-tokens", "4"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {drafter}: {error}"
