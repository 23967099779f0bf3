"""SpecForge import behaviours no test pinned (found by a mutation audit): the listing hash reads names
relative to the root, sizes and tails only; read_sample's checks and trims on their own."""

from __future__ import annotations

import gzip
import io
import shutil

import pytest
import torch

from drafter_lab.data.specforge import TAIL, _listing_hash, import_specforge, read_sample
from drafter_lab.errors import LabError


def _files(root, blobs: dict[str, bytes]):
    for name, blob in blobs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(blob)
    return sorted(root / name for name in blobs)


def test_the_listing_hash_reads_names_sizes_and_tails_only(tmp_path):
    """Cheap on terabytes: a file's head is not read (torch.save's zip keeps each tensor's CRC in its tail);
    a copy elsewhere hashes the same, and another size, tail or name does not."""
    big = bytes(range(256)) * (3 * TAIL // 256)
    base = _listing_hash(tmp_path / "a", _files(tmp_path / "a", {"r/x.ckpt": big, "y.ckpt": b"small"}))
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    assert _listing_hash(tmp_path / "copy", sorted((tmp_path / "copy").rglob("*.ckpt"))) == base
    head = b"\xff" + big[1:]  # another head, same size and tail: never read
    assert _listing_hash(tmp_path / "b", _files(tmp_path / "b", {"r/x.ckpt": head, "y.ckpt": b"small"})) == base
    for k, other in enumerate(({"r/x.ckpt": big[:-1] + b"\0", "y.ckpt": b"small"},  # the tail
                               {"r/x.ckpt": b"\0" + big, "y.ckpt": b"small"},  # the size (the tail is the same)
                               {"r/z.ckpt": big, "y.ckpt": b"small"})):  # a name
        root = tmp_path / f"other{k}"
        assert _listing_hash(root, _files(root, other)) != base, other


def _sample(n=4, hidden=8, **over):
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.arange(1, n + 1), "loss_mask": torch.ones(n, dtype=torch.long),
            "hidden_state": torch.randn(1, n, hidden, generator=g),
            "aux_hidden_state": torch.randn(1, n, 3 * hidden, generator=g), **over}


def _read(tmp_path, sample, **kw):
    path = tmp_path / "s.ckpt"
    torch.save(sample, path)
    return read_sample(path, "s", kw.pop("hidden", 8), kw.pop("vocab", 100), **kw)


@pytest.mark.parametrize("over, message", [
    ({"hidden_state": None}, "SpecForge sample's ['hidden_state'] are not tensors"),
    ({"attention_mask": [1, 1, 1, 1]}, "attention_mask is not a tensor"),
    ({"attention_mask": torch.ones(3)}, "attention_mask (3,) is not ones then zeros over input_ids (4,)"),
    ({"attention_mask": torch.tensor([1, 0, 1, 0])}, "attention_mask (4,) is not ones then zeros"),
    ({"input_ids": torch.arange(1, 9).view(2, 4)}, "input_ids has shape (2, 4), want [T] or [1, T]"),
    ({"loss_mask": torch.ones(3, dtype=torch.long)}, "shapes do not fit the target (hidden 8)"),
    ({"aux_hidden_state": torch.zeros(1, 4, 16)}, "aux_hidden_state (4, 16)"),
    ({"loss_mask": torch.tensor([1, -1, 0, 1])}, "loss_mask holds values other than 0 and 1"),
    ({"hidden_state": torch.zeros(1, 4, 8, dtype=torch.bfloat16)}, "hidden_state is torch.bfloat16 but aux_hidden"),
    ({"hidden_state": torch.full((1, 4, 8), float("nan"))}, "NaN or inf in the hidden states"),
    ({"aux_hidden_state": torch.full((1, 4, 24), float("inf"))}, "NaN or inf in the hidden states"),
    ({"input_ids": torch.tensor([1, 2, 3, 100])}, "input_ids run 1..100, outside the target's vocabulary 0..99"),
    ({"input_ids": torch.tensor([-1, 2, 3, 4])}, "input_ids run -1..4"),
])
def test_a_sample_that_does_not_fit_names_what(tmp_path, over, message):
    """Each would otherwise be stored as something else, or fail later with a traceback."""
    with pytest.raises(LabError) as e:
        _read(tmp_path, _sample(**over))
    assert message in str(e.value) and str(tmp_path / "s.ckpt") in str(e.value), str(e.value)


def test_a_sample_missing_a_key_names_them_all(tmp_path):
    sample = _sample()
    del sample["loss_mask"], sample["aux_hidden_state"]
    with pytest.raises(LabError, match=r"SpecForge sample lacks \['aux_hidden_state', 'loss_mask'\]"):
        _read(tmp_path, sample)


def test_read_sample_keeps_the_real_tokens_as_ids_and_a_bool_mask(tmp_path):
    """[1, T] rows flattened; the trailing zeros dropped, but a real token 0 with loss (ids say pad, the mask
    says not) kept; an attention_mask of ones then zeros decides; a row of padding only is empty."""
    s = _read(tmp_path, _sample(input_ids=torch.tensor([[4, 0, 0, 0]]).int(), loss_mask=torch.tensor([1, 1, 0, 0])))
    assert s.input_ids.tolist() == [4, 0] and s.input_ids.dtype == torch.long
    assert s.loss_mask.tolist() == [True, True] and s.loss_mask.dtype == torch.bool
    assert s.final_hidden.shape == (2, 8) and s.aux_hidden.shape == (2, 24)
    s = _read(tmp_path, _sample(input_ids=torch.tensor([4, 5, 0, 0]), loss_mask=torch.zeros(4, dtype=torch.long)))
    assert s.input_ids.tolist() == [4, 5]  # the ids say where the real tokens end
    s = _read(tmp_path, _sample(input_ids=torch.tensor([4, 5, 0, 0]), loss_mask=torch.zeros(4, dtype=torch.long),
                                attention_mask=torch.tensor([[1, 1, 1, 0]])))
    assert s.input_ids.tolist() == [4, 5, 0]
    s = _read(tmp_path, _sample(input_ids=torch.zeros(4, dtype=torch.long), loss_mask=torch.zeros(4, dtype=torch.long),
                                hidden_state=torch.zeros(1, 4, 8), aux_hidden_state=torch.zeros(1, 4, 24)), vocab=0)
    assert len(s.input_ids) == 0  # padding only: no ids to check against the (here empty) vocabulary


def test_the_first_samples_dtype_binds_the_rest(tmp_path):
    s = _read(tmp_path, _sample(), dtype=torch.float32)
    assert s.aux_hidden.dtype == torch.float32
    with pytest.raises(LabError, match="hidden states are torch.float32, but the first sample's are torch.bfloat16"):
        _read(tmp_path, _sample(), dtype=torch.bfloat16)


def test_a_gzipped_sample_reads_as_its_plain_copy_and_a_bad_one_is_named(tmp_path):
    buf = io.BytesIO()
    torch.save(_sample(), buf)
    (tmp_path / "s.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
    plain = _read(tmp_path, _sample())
    zipped = read_sample(tmp_path / "s.ckpt.gz", "s", 8, 100)
    assert torch.equal(zipped.aux_hidden, plain.aux_hidden) and torch.equal(zipped.input_ids, plain.input_ids)
    for name, blob in (("plain.ckpt.gz", buf.getvalue()), ("cut.ckpt.gz", gzip.compress(buf.getvalue())[:-40])):
        (tmp_path / name).write_bytes(blob)  # not gzip at all; gzip cut short
        with pytest.raises(LabError, match=f"^{tmp_path / name}: cannot read as a gzipped SpecForge sample"):
            read_sample(tmp_path / name, "s", 8, 100)
    with pytest.raises(LabError, match="holds list, not a SpecForge sample"):
        _read(tmp_path, [1])


def _sf_dir(root, n=2):
    root.mkdir(parents=True)
    for k in range(n):
        torch.save(_sample(), root / f"s{k}.ckpt")
    return root


@pytest.mark.parametrize("typed, message", [
    ([0, 1, 2, 2], "need exactly 3 aux layer ids, got [0, 1, 2, 2]"),
    ([-1, 0, 1], "aux layer ids [-1, 0, 1] out of range: SpecForge's (the output of layer i) run 0..2 for a target "
                 "of 4 layers"),
    ([0, 1, 3], "aux layer ids [0, 1, 3] out of range"),
    ([2, 0, 1], "aux layer ids [2, 0, 1] are not in layer order"),
])
def test_aux_ids_are_refused_as_typed(tiny_target, tmp_path, typed, message):
    with pytest.raises(LabError) as e:
        import_specforge(_sf_dir(tmp_path / "sf"), tiny_target, tmp_path / "out", aux_layer_ids=typed)
    assert message in str(e.value), str(e.value)


def test_aux_ids_shift_and_the_default_passes_as_typed(tiny_target, tmp_path):
    """SpecForge's "output of layer i" is our hidden_states[i + 1]; its own default for a few layers (here
    [1, 1, 0]: repeated, backwards) is taken when typed, as it is when not."""
    for k, (typed, ours) in enumerate((([0, 1, 2], [1, 2, 3]), ([1, 1, 0], [2, 2, 1]), (None, [2, 2, 1]))):
        manifest = import_specforge(_sf_dir(tmp_path / f"sf{k}"), tiny_target, tmp_path / f"out{k}",
                                    aux_layer_ids=typed)
        assert manifest.aux_layer_ids == ours, typed
    from drafter_lab.data.shards import FeatureSet

    fs = FeatureSet(tmp_path / "out0")  # a sample's id is its path less .ckpt
    assert sorted(s.seq_id for split in ("train", "val") for s in fs.sequences(split)) == ["s0", "s1"]


def test_a_sample_gzipped_and_not_is_refused(tiny_target, tmp_path):
    src = _sf_dir(tmp_path / "sf")
    (src / "s0.ckpt.gz").write_bytes(gzip.compress((src / "s0.ckpt").read_bytes()))
    with pytest.raises(LabError, match="s0.ckpt and s0.ckpt.gz are one sample, gzipped and not: keep one"):
        import_specforge(src, tiny_target, tmp_path / "out")
    with pytest.raises(LabError, match="is a file, not a directory"):
        import_specforge(src / "s1.ckpt", tiny_target, tmp_path / "out")
