"""Aux layer ids out of layer order are refused: SGLang and vLLM append each captured state as their
layer loop passes it, so a drafter's fc is always served [h_low, h_mid, h_high]; trained (or captured)
in another order, its three input blocks would be swapped without a word."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab import cli
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import check_aux_layer_ids

ORDER = "are not in layer order: SGLang and vLLM hand the drafter's fc the states in layer order"


@pytest.mark.parametrize("ids", [[5, 4, 2], [2, 5, 4], [4, 2, 5]])
def test_ids_out_of_order_are_refused(ids):
    with pytest.raises(LabError) as e:
        check_aux_layer_ids(ids, 8, None)
    assert str(e.value) == f"aux layer ids {ids} {ORDER} ([2, 4, 5]), so give them ascending"
    assert check_aux_layer_ids([2, 4, 5], 8, None) == [2, 4, 5]
    # a target of a few layers: its default ([2, L//2, L-3], SGLang's too) is taken as engines take it
    assert check_aux_layer_ids([2, 2, 1], 4, None) == [2, 2, 1]


def test_data_prepare_refuses_them(random_llama, tmp_path, capsys):
    convs = tmp_path / "c.jsonl"
    convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "hello there"}]}) + "\n")
    out = tmp_path / "feat"
    assert cli.main(["data", "prepare", "--target", str(random_llama), "--conversations", str(convs),
                     "--out", str(out), "--aux-layer-ids", "5,4,2"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {random_llama}: aux layer ids [5, 4, 2] {ORDER} "
                                               "([2, 4, 5]), so give them ascending")
    assert not (out / "manifest.json").exists()


def test_a_drafter_that_lists_them_out_of_order_is_refused(random_llama, random_drafter, prompts_file, tmp_path,
                                                           capsys):
    """Its config (`eagle_aux_hidden_state_layer_ids`) was read in list order, where engines serve layer order."""
    d = Eagle3Drafter(dataclasses.replace(random_drafter.config, aux_layer_ids=[5, 2, 4]))
    d.load_state_dict(random_drafter.state_dict())
    drafter = save_drafter(d, tmp_path / "drafter")
    assert cli.main(["eval", "--drafter", str(drafter), "--target", str(random_llama), "--prompts", str(prompts_file),
                     "--max-new-tokens", "4"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {drafter}: aux layer ids [5, 2, 4] {ORDER} ([2, 4, 5]), "
                                               "so give them ascending")
