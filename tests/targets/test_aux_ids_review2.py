"""Three aux layer ids that name a layer twice, or list them out of layer order, are refused, wherever
they come from."""

from __future__ import annotations

import json

import pytest

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import check_aux_layer_ids


@pytest.mark.parametrize("ids, pair", [([2, 2, 3], "#1 and #2"), ([2, 4, 2], "#1 and #3"), ([5, 4, 4], "#2 and #3")])
def test_a_repeated_layer_is_refused(ids, pair):
    with pytest.raises(LabError, match=f"aux layer ids {pair} name the same layer"):
        check_aux_layer_ids(ids, 8, None)
    assert check_aux_layer_ids([2, 4, 5], 8, None) == [2, 4, 5]
    # the default of a target of a few layers repeats one, as SGLang's does: taken as engines take it
    assert check_aux_layer_ids([2, 2, 1], 4, None) == [2, 2, 1]
    with pytest.raises(LabError, match="#1 and #2"):
        check_aux_layer_ids([2, 2, 1], 8, None)


ORDER = "are not in layer order: SGLang and vLLM hand the drafter's fc the states in layer order"


@pytest.mark.parametrize("ids", [[5, 4, 2], [2, 5, 4], [4, 2, 5]])
def test_ids_out_of_layer_order_are_refused(ids):
    """SGLang and vLLM append each captured state as their layer loop passes it: trained on another
    order, fc's three input blocks would be served swapped."""
    with pytest.raises(LabError) as e:
        check_aux_layer_ids(ids, 8, None)
    assert str(e.value) == f"aux layer ids {ids} {ORDER} ([2, 4, 5]), so give them ascending"


@pytest.mark.parametrize("ids, error", [
    ("2,2,3", "aux layer ids #1 and #2 name the same layer: EAGLE-3 fuses the hidden states of three distinct layers"),
    ("5,4,2", f"aux layer ids [5, 4, 2] {ORDER} ([2, 4, 5]), so give them ascending"),
])
def test_data_prepare_refuses_it(ids, error, random_llama, tmp_path, capsys):
    """It captured and trained on one layer's features twice, or in an order no engine serves."""
    convs = tmp_path / "c.jsonl"
    convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "hello there"}]}) + "\n")
    out = tmp_path / "feat"
    assert cli.main(["data", "prepare", "--target", str(random_llama), "--conversations", str(convs),
                     "--out", str(out), "--aux-layer-ids", ids]) == 2
    assert capsys.readouterr().err.strip() == f"error: {random_llama}: {error}"
    assert not (out / "manifest.json").exists()
