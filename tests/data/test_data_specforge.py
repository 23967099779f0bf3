"""`data import-specforge`: SpecForge offline samples (*.ckpt) become a feature directory that
trains, with the aux ids converted, the same split as a capture, and resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from drafter_lab.data.capture import split_of
from drafter_lab.data.shards import FeatureSet
from drafter_lab.data.specforge import import_specforge
from drafter_lab.errors import LabError


def _specforge_dir(features, root):
    """Write the captured sequences the way SpecForge's prepare_hidden_states stores them."""
    fs = FeatureSet(features)
    seqs = fs.sequences("train") + fs.sequences("val")
    for i, s in enumerate(seqs):
        sample = {
            "input_ids": s.input_ids[None] if i % 2 else s.input_ids,  # both layouts occur
            "loss_mask": s.loss_mask.long(),
            "hidden_state": s.final_hidden[None].bfloat16(),
            "aux_hidden_state": s.aux_hidden[None].bfloat16(),
        }
        (root / f"rows_{i // 8}").mkdir(parents=True, exist_ok=True)
        torch.save(sample, root / f"rows_{i // 8}" / f"data_{i}.ckpt")
    return {f"rows_{i // 8}/data_{i}": s for i, s in enumerate(seqs)}


def test_import_matches_the_samples_and_trains(random_llama, features, tmp_path):
    want = _specforge_dir(features, tmp_path / "sf")
    manifest = import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", aux_layer_ids=[1, 3, 4],
                                val_fraction=0.25, shard_size=5)
    assert manifest.aux_layer_ids == [2, 4, 5] and manifest.dtype == "bfloat16"
    assert manifest.source["format"] == "specforge-offline" and manifest.source["files"] == len(want)
    fs = FeatureSet(tmp_path / "out")
    got = {s.seq_id: (split, s) for split in ("train", "val") for s in fs.sequences(split)}
    assert set(got) == set(want)
    for seq_id, (split, s) in got.items():
        w = want[seq_id]
        assert split == split_of(seq_id, 0.25)
        assert torch.equal(s.input_ids, w.input_ids) and torch.equal(s.loss_mask, w.loss_mask)
        assert torch.equal(s.aux_hidden, w.aux_hidden.bfloat16()) and torch.equal(s.final_hidden, w.final_hidden.bfloat16())

    from drafter_lab.train.config import TrainConfig
    from drafter_lab.train.loop import train

    final = train(TrainConfig(draft_vocab_size=32, max_steps=2, batch_size=4, ttt_steps=2, threads=1),
                  random_llama, tmp_path / "out", tmp_path / "drafter")
    assert 0.0 <= final["cond_acc_0"] <= 1.0


def test_rerun_resumes_and_rewrites_the_same_shard(random_llama, features, tmp_path):
    _specforge_dir(features, tmp_path / "sf")
    out = tmp_path / "out"
    import_specforge(tmp_path / "sf", random_llama, out, shard_size=4)
    shards = sorted(out.glob("*.safetensors"))
    before = {p: p.read_bytes() for p in shards}
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    shards[0].unlink()  # a killed import: the manifest still lists it, the file is gone
    import_specforge(tmp_path / "sf", random_llama, out, shard_size=4)
    assert {p: p.read_bytes() for p in shards} == before
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards[1:])
    with pytest.raises(LabError, match="other settings"):
        import_specforge(tmp_path / "sf", random_llama, out, shard_size=4, aux_layer_ids=[0, 1, 2])
    # SpecForge's ids, told as typed: 7 is the 8-layer target's last layer, hidden_states[8] (the final norm)
    with pytest.raises(LabError, match=r"aux layer ids \[1, 3, 7\] out of range: SpecForge's \(the output of layer i\) "
                                       r"run 0..6 for a target of 8 layers"):
        import_specforge(tmp_path / "sf", random_llama, tmp_path / "other", aux_layer_ids=[1, 3, 7])


def test_a_sample_that_does_not_fit_is_one_line_naming_it(random_llama, features, tmp_path):
    _specforge_dir(features, tmp_path / "sf")
    bad = sorted((tmp_path / "sf").rglob("*.ckpt"))[0]
    sample = torch.load(bad, weights_only=True)
    sample["aux_hidden_state"] = sample["aux_hidden_state"][..., :-1]
    torch.save(sample, bad)
    run = subprocess.run(
        [sys.executable, "-m", "drafter_lab", "data", "import-specforge", "--hidden-states", str(tmp_path / "sf"),
         "--target", str(random_llama), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and str(bad) in lines[0] and "aux_hidden_state" in lines[0]
    assert not (tmp_path / "out" / "manifest.json").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabError, match="no \\*.ckpt files"):
        import_specforge(tmp_path / "empty", random_llama, tmp_path / "out2")


def _sample(ids, mask=None, dtype=torch.float32, hidden=64):
    n = len(ids)
    return {"input_ids": ids, "loss_mask": torch.ones(n, dtype=torch.long) if mask is None else mask,
            "hidden_state": torch.zeros(1, n, hidden, dtype=dtype), "aux_hidden_state": torch.zeros(1, n, 3 * hidden, dtype=dtype)}


@pytest.mark.parametrize(("bad", "message"), [
    (lambda v: _sample(torch.tensor([1, v + 100])), "outside the target's vocabulary"),
    (lambda v: _sample(torch.tensor([-3, 1])), "outside the target's vocabulary"),
    (lambda v: _sample(torch.tensor([2**40, 1])), "outside the target's vocabulary"),  # 0 once cast to int32
    (lambda v: _sample(torch.tensor([1.0, 2.5])), "input_ids are torch.float32, not integers"),
    (lambda v: _sample(torch.tensor([1, 2]), mask=torch.tensor([0.3, 1.0])), "loss_mask holds values other than 0 and 1"),
    (lambda v: _sample(torch.tensor([1, 2]), dtype=torch.bfloat16), "the first sample's are torch.float32"),
    (lambda v: 5, "holds int, not a SpecForge sample"),
    (lambda v: {**_sample(torch.tensor([1, 2])), "input_ids": [1, 2]}, "['input_ids'] are not tensors"),
])
def test_a_bad_sample_is_refused_naming_it(random_llama, tmp_path, bad, message):
    """Each would otherwise be stored as something else (an id wrapped, 2.5 as 2, 0.3 as True, a cast)."""
    vocab = json.loads((random_llama / "config.json").read_text())["vocab_size"]
    (tmp_path / "sf").mkdir()
    torch.save(_sample(torch.tensor([1, 2])), tmp_path / "sf" / "a.ckpt")
    torch.save(bad(vocab), tmp_path / "sf" / "b.ckpt")
    with pytest.raises(LabError) as e:
        import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", val_fraction=0.0, shard_size=1)
    assert message in str(e.value) and str(tmp_path / "sf" / "b.ckpt") in str(e.value) and "\n" not in str(e.value)


def test_a_resume_over_rewritten_samples_is_refused(random_llama, tmp_path):
    """SpecForge run again into the same directory: same names and shapes, other values. The shards
    written before must not be kept beside ones from the new files."""
    (tmp_path / "sf").mkdir()

    def write(fill):
        for k in range(3):
            torch.save({**_sample(torch.full((8,), fill + k)), "hidden_state": torch.full((1, 8, 64), float(fill)),
                        "aux_hidden_state": torch.full((1, 8, 192), float(fill))}, tmp_path / "sf" / f"s{k}.ckpt")

    out = tmp_path / "out"
    write(10)
    import_specforge(tmp_path / "sf", random_llama, out, val_fraction=0.0, shard_size=1)
    (out / "train-00000.safetensors").unlink()  # as if killed before the first shard landed
    write(20)
    with pytest.raises(LabError, match="other settings \\(listing_sha256"):
        import_specforge(tmp_path / "sf", random_llama, out, val_fraction=0.0, shard_size=1)
