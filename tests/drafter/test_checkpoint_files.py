"""Which files of a drafter directory are its weights: an accelerate checkpoint's optimizer.bin,
scheduler.bin and sampler.bin beside pytorch_model.bin are not (no engine reads them)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.drafter.checkpoint import load_drafter, read_checkpoint, read_vocab, save_drafter

from .test_formats import assert_same_state
from .test_model import random_drafter, small_config


class _Sampler(torch.utils.data.RandomSampler):
    """Stands for accelerate's SeedableRandomSampler, which save_state pickles whole into sampler.bin."""


def _trained():
    """A drafter after one AdamW step, its optimizer and scheduler."""
    drafter = random_drafter(small_config(), seed=5, dtype=torch.float32)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
    for p in drafter.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    opt.step()
    return drafter, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)


@pytest.mark.parametrize("layout", ["safetensors", "bin", "bin shards"])
def test_training_state_beside_the_weights_is_not_read(tmp_path, layout):
    drafter, opt, sched = _trained()
    d = save_drafter(drafter, tmp_path / "drafter")
    if layout != "safetensors":  # as accelerate's save_state(safe_serialization=False) writes the model
        state = load_file(str(d / "model.safetensors"))
        (d / "model.safetensors").unlink()
        if layout == "bin":
            torch.save(state, d / "pytorch_model.bin")
        else:  # shards under names only the index gives
            names = sorted(state)
            half = {f"model-{i}.bin": names[i::2] for i in range(2)}
            for file, keys in half.items():
                torch.save({k: state[k] for k in keys}, d / file)
            index = {"weight_map": {k: f for f, keys in half.items() for k in keys}}
            (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    clean = tmp_path / "clean"
    shutil.copytree(d, clean)
    torch.save(opt.state_dict(), d / "optimizer.bin")
    torch.save(sched.state_dict(), d / "scheduler.bin")
    torch.save(_Sampler(range(4)), d / "sampler.bin")  # not loadable with weights_only
    torch.save({"optimizer": opt.state_dict()}, d / "training_state.pt")
    torch.save({"cpu": torch.get_rng_state()}, d / "rng_state.pth")
    (d / "random_states_0.pkl").write_bytes(b"\x80\x04N.")

    assert [f.name for f in read_checkpoint(d).files] == [f.name for f in read_checkpoint(clean).files]
    assert_same_state(load_drafter(d), load_drafter(clean))
    assert_same_state(load_drafter(d), drafter)
    assert torch.equal(read_vocab(d).d2t, read_vocab(clean).d2t)
    # a save killed while it wrote the optimizer's state (after the model's) leaves the drafter whole
    data = (d / "optimizer.bin").read_bytes()
    (d / "optimizer.bin").write_bytes(data[: len(data) // 2])
    assert_same_state(load_drafter(d), drafter)
