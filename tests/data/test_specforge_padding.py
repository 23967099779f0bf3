"""`data import-specforge` over rows as SpecForge's batched prepare_hidden_states saves them: its
collator right-pads each batch with zeros (input_ids 0, loss_mask 0), the target runs over the
padded row, and the whole row is saved, without an attention_mask. Only the real tokens and their
states may reach the shards."""

from __future__ import annotations

import pytest
import torch
from test_specforge_review import H

from drafter_lab.data.shards import FeatureSet
from drafter_lab.data.specforge import import_specforge
from drafter_lab.errors import LabError


def _batch(rows: list[tuple[list[int], list[int]]], seed: int = 0) -> list[tuple[dict, dict]]:
    """(saved sample, real part) per row: ids and masks padded with zeros to the longest, the states
    over the padded length (the pad positions' states are real numbers, as the target computes them)."""
    g = torch.Generator().manual_seed(seed)
    width = max(len(ids) for ids, _ in rows)
    out = []
    for ids, mask in rows:
        final, aux = torch.randn(width, H, generator=g).bfloat16(), torch.randn(width, 3 * H, generator=g).bfloat16()
        pad = width - len(ids)
        saved = {"input_ids": torch.tensor(ids + [0] * pad), "loss_mask": torch.tensor(mask + [0] * pad),
                 "hidden_state": final[None], "aux_hidden_state": aux[None]}
        n = len(ids)
        out.append((saved, {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask).bool(),
                            "final": final[:n], "aux": aux[:n]}))
    return out


def _import(random_llama, tmp_path, samples: list[dict]):
    (tmp_path / "sf" / "rows_0-2000").mkdir(parents=True)
    for i, s in enumerate(samples):
        torch.save(s, tmp_path / "sf" / "rows_0-2000" / f"data_{i}.ckpt")
    import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", val_fraction=0.0, shard_size=2)
    return {s.seq_id: s for s in FeatureSet(tmp_path / "out").sequences("train")}


def test_padded_rows_import_as_their_real_tokens(random_llama, tmp_path):
    rows = [
        ([5, 7, 9, 11, 13, 15, 17, 19], [0, 0, 1, 1, 1, 1, 1, 1]),  # the batch's longest: no padding
        ([5, 7, 9, 11], [0, 0, 1, 1]),
        ([5, 0, 9, 12, 3], [0, 0, 1, 1, 0]),  # an id 0 inside, and a real non-loss token at the end
        ([4, 6], [0, 1]),
    ]
    batch = _batch(rows)
    got = _import(random_llama, tmp_path, [saved for saved, _ in batch])
    assert sorted(got) == [f"rows_0-2000/data_{i}" for i in range(len(rows))]
    for i, (_, want) in enumerate(batch):
        s = got[f"rows_0-2000/data_{i}"]
        assert torch.equal(s.input_ids, want["input_ids"]) and torch.equal(s.loss_mask, want["loss_mask"])
        assert torch.equal(s.final_hidden, want["final"]) and torch.equal(s.aux_hidden, want["aux"])


def test_an_attention_mask_decides_where_a_file_has_one(random_llama, tmp_path):
    """A real token 0 without loss at the end is kept when the file says it is real."""
    (saved, want), (other, _) = _batch([([3, 8, 0], [0, 1, 0]), ([3, 8, 2, 6, 1], [0, 1, 1, 1, 1])])
    saved["attention_mask"] = torch.tensor([1, 1, 1, 0, 0])
    got = _import(random_llama, tmp_path, [saved, other])["rows_0-2000/data_0"]
    assert torch.equal(got.input_ids, want["input_ids"]) and torch.equal(got.loss_mask, want["loss_mask"])
    assert torch.equal(got.final_hidden, want["final"]) and torch.equal(got.aux_hidden, want["aux"])


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.__setitem__("attention_mask", torch.tensor([0, 0, 1, 1, 1])), "attention_mask (5,) is not ones then zeros"),
    (lambda s: s.__setitem__("attention_mask", torch.tensor([1, 1, 1])), "attention_mask (3,) is not ones then zeros"),
    (lambda s: s.__setitem__("hidden_state", s["hidden_state"][:, :4]), "shapes do not fit the target"),
])
def test_a_padded_row_that_does_not_fit_is_one_line_naming_it(random_llama, tmp_path, change, message):
    (saved, _), (other, _) = _batch([([3, 8, 2], [0, 1, 1]), ([3, 8, 2, 6, 1], [0, 1, 1, 1, 1])])
    change(saved)
    with pytest.raises(LabError) as e:
        _import(random_llama, tmp_path, [other, saved])
    assert message in str(e.value) and "data_1.ckpt" in str(e.value) and "\n" not in str(e.value)
