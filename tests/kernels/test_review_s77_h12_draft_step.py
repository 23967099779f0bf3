"""draft_step's face (second audit): on CPU the default path is the reference even for a step the
kernels would take, and op_args' refusal names the width it was given."""

from __future__ import annotations

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.kernels import draft_step as ds

# What op_takes wants: head_dim 64, H a multiple of 8, the MLP width of 16; fc 3*32 -> 64.
CFG = DrafterConfig(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    draft_vocab_size=40, target_vocab_size=90, target_hidden_size=32, aux_layer_ids=[1, 2, 3])


def _step():
    torch.manual_seed(0)
    drafter = Eagle3Drafter(CFG)
    g = torch.Generator().manual_seed(1)
    embeds = torch.randn(2, CFG.hidden_size, generator=g)
    aux = torch.randn(2, 3 * CFG.target_hidden_size, generator=g)
    k, v = drafter.new_kv_cache(2, 8)
    return drafter, embeds, aux, torch.tensor([3, 0]), k, v


def test_the_default_path_on_cpu_is_the_reference_even_for_a_step_the_kernels_take(monkeypatch):
    drafter, embeds, aux, lens, k, v = _step()
    assert ds.cuda_supports(drafter, embeds, aux, k, v, 3)  # only the device keeps it off the op
    monkeypatch.setattr(ds, "op_args", lambda *a, **kw: pytest.fail("the default CPU path built the op's arguments"))
    with torch.no_grad():
        want = drafter.draft_step(embeds, aux, lens, k.clone(), v.clone(), lens, 3)
        got = ds.draft_step(drafter, embeds, aux, lens, k, v, lens, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_op_args_names_the_width_it_was_given():
    drafter, embeds, aux, lens, k, v = _step()
    with pytest.raises(ValueError, match=r"^hidden has width 5, want 64 or 3\*H_t$"):
        ds.op_args(drafter, embeds, aux[:, :5], lens, k, v, lens, 3)
