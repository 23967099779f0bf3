"""Three aux layer ids that name a layer twice are refused, wherever they come from."""

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


def test_data_prepare_refuses_it(random_llama, tmp_path, capsys):
    """It captured and trained on one layer's features twice."""
    convs = tmp_path / "c.jsonl"
    convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "hello there"}]}) + "\n")
    out = tmp_path / "feat"
    assert cli.main(["data", "prepare", "--target", str(random_llama), "--conversations", str(convs),
                     "--out", str(out), "--aux-layer-ids", "2,2,3"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {random_llama}: aux layer ids #1 and #2 name the same layer: "
                                               "EAGLE-3 fuses the hidden states of three distinct layers")
    assert not (out / "manifest.json").exists()
