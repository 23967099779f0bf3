"""A drafter that cannot serve beside a target of another vocab size says so first, not
"pass --allow-other-target" (which then failed with the real reason)."""

from __future__ import annotations

import pytest
import torch

from drafter_lab import cli
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.targets.hf import default_aux_layer_ids


@pytest.fixture(scope="module")
def bigger_llama(tmp_path_factory, llama_maker):
    return llama_maker(tmp_path_factory.mktemp("bigger") / "model", vocab=600)


def _drafter(target, used, out, head):
    cfg = DrafterConfig.for_target(target.config, len(used), default_aux_layer_ids(target.num_layers))
    d = Eagle3Drafter(cfg).eval()
    with torch.no_grad():
        d.d2t.copy_(used - torch.arange(len(used)))
        d.t2d.zero_()
        d.t2d[used] = True
    return save_drafter(d, out, "speculators", embed=False, head=head)


@pytest.mark.parametrize("flag", [[], ["--allow-other-target"]])
def test_what_the_flag_would_not_fix_is_named_first(target, random_llama, bigger_llama, prompts_file, tmp_path,
                                                    capsys, flag):
    from drafter_lab.targets.hf import load_target

    big = load_target(bigger_llama)
    cases = [(_drafter(target, torch.arange(target.vocab_size), tmp_path / "whole", head=False), bigger_llama,
              "the drafter was trained for a 512-token target, this one has 600: it drafts over its target's "
              "whole vocabulary with its target's lm_head"),
             (_drafter(big, torch.arange(500, 600), tmp_path / "high", head=True), random_llama,
              "the drafter was trained for a 600-token target, this one has 512: its draft tokens name target "
              "ids up to 599")]
    for drafter, on, why in cases:
        assert cli.main(["eval", "--drafter", str(drafter), "--target", str(on), "--prompts", str(prompts_file),
                         "--max-new-tokens", "4", *flag]) == 2
        assert capsys.readouterr().err.strip() == f"error: {drafter}: {why}"
