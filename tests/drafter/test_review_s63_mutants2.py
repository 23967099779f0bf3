"""A draft step fed the drafter's own hidden state does not put it through fc, even where its width equals
3 x the target's hidden size (mutation audit, round 2)."""

from __future__ import annotations

import torch

from .test_model import random_drafter, small_config


def test_a_later_steps_hidden_skips_fc_when_its_width_is_also_three_target_widths():
    cfg = small_config(hidden_size=48, target_hidden_size=16)  # 3 * 16 == 48: the width alone cannot tell
    d = random_drafter(cfg, seed=5)
    g = torch.Generator().manual_seed(6)
    h = torch.randn(2, 48, generator=g, dtype=torch.float64)  # a draft step's output, fed to the next
    embeds = d.embed(torch.tensor([3, 7]))
    outs = []
    for fc_scale in (1.0, 0.0):  # with fc's weights zeroed nothing may change: fc is not on this path
        with torch.no_grad():
            d.fc.weight.mul_(fc_scale)
            kc, vc = d.new_kv_cache(2, 4)
            outs.append(d.draft_step(embeds, h, torch.tensor([1, 2]), kc, vc, torch.tensor([1, 2]), topk=3))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
