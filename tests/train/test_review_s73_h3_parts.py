"""Fixture-free checks of _Run.check_finite on a bare _Run, and of loop's resume helper _load_model
on a tiny real drafter."""

from __future__ import annotations

import math
import types

import pytest
import torch

from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.errors import LabError
from drafter_lab.train import loop

_D2T = torch.tensor([0, 1, 3, 6])
_T2D = torch.zeros(10, dtype=torch.bool)
_T2D[[0, 2, 5, 9]] = True


class _Target:
    def embed_weight(self):
        return torch.ones(10, 16)

    def lm_head_weight(self):
        return torch.ones(10, 16)


def _drafter(intermediate=32) -> loop.Eagle3Drafter:
    dcfg = DrafterConfig(hidden_size=16, intermediate_size=intermediate, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, draft_vocab_size=4, target_vocab_size=10, target_hidden_size=16,
                         aux_layer_ids=[0, 1, 2])
    return loop._new_drafter(types.SimpleNamespace(seed=0, init_lm_head_from_target=False), dcfg, _Target(), _D2T, _T2D)


def test_the_first_diverged_step_of_any_rank_is_named_not_the_smallest_loss(tmp_path):
    """Rank 0 diverged at step 5 (its gradient norm), rank 1 earlier, at step 3 (its loss, larger)."""
    rows = torch.tensor([[5, 2.0, math.inf], [3, math.inf, math.nan]], dtype=torch.float64)
    run = object.__new__(loop._Run)
    run.out_dir, run.kept_step, run.cfg = tmp_path, 2, types.SimpleNamespace(grad_clip=1.0)
    run.nonfinite = rows[0]
    run.d = types.SimpleNamespace(world=2, rank=0, device=torch.device("cpu"),
                                  sum=lambda seen: seen + torch.cat([torch.zeros(1, 3), rows[1:]]))
    with pytest.raises(LabError) as e:
        run.check_finite()
    assert str(e.value) == (f"{tmp_path}: loss is inf at step 3: the run diverged (lower --lr); "
                            "the last checkpoint, step 2, is kept")


def test_a_state_whose_weights_have_other_shapes_is_one_line_naming_them_and_its_file(tmp_path):
    """load_state_dict raised its many-line RuntimeError here, strict=False or not, naming no file."""
    drafter = _drafter()
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    other = {k: v for k, v in _drafter(intermediate=48).state_dict().items() if k != "embed_tokens.weight"}
    with pytest.raises(LabError) as e:
        loop._load_model(drafter, other, tmp_path / "state.pt")
    said = str(e.value)
    assert said.startswith(f"{tmp_path / 'state.pt'}: train state does not fit the drafter (") and "\n" not in said
    assert "midlayer.mlp.gate_proj.weight [48, 16], not [32, 16]" in said
    assert "fc.weight" not in said  # the weights that fit are not named
    assert all(torch.equal(v, before[k]) for k, v in drafter.state_dict().items())  # nothing half-loaded


def test_a_value_that_is_not_a_tensor_is_named_too(tmp_path):
    drafter = _drafter()
    state = {k: v for k, v in drafter.state_dict().items() if k != "embed_tokens.weight"}
    with pytest.raises(LabError, match=r"does not fit the drafter \(fc.weight int, not \[16, 48\]\)"):
        loop._load_model(drafter, {**state, "fc.weight": 3}, tmp_path / "state.pt")
