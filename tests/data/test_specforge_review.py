"""`data import-specforge` against files written the way SpecForge's prepare_hidden_states writes
them: the conventions (aux "output of layer k", final state after the norm), the directory layouts
it leaves, and a resume after SIGKILL."""

from __future__ import annotations

import gzip
import io
import json
import signal
import subprocess
import sys

import pytest
import torch

from drafter_lab.data.shards import FeatureSet
from drafter_lab.data.specforge import import_specforge
from drafter_lab.errors import LabError

H = 64  # the random_llama fixture's hidden size


def _sample(n: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 200, (n,), generator=g), "loss_mask": torch.randint(0, 2, (n,), generator=g),
            "hidden_state": torch.randn(1, n, H, generator=g).bfloat16(),
            "aux_hidden_state": torch.randn(1, n, 3 * H, generator=g).bfloat16()}


def test_specforge_conventions_match_the_targets_own_states(random_llama, tmp_path):
    """SpecForge's aux state k is layer k's output (a hook on layers[k]) and its hidden_state the
    final norm's output (what its logits processor hands lm_head); both layouts, bf16. Imported, they
    are HF hidden_states[k + 1] and hidden_states[L], as the lab captures them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_llama).eval()
    L = model.config.num_hidden_layers
    theirs = [1, L // 2 - 1, L - 4]  # SpecForge's default
    want = {}
    for i in range(4):
        n = 9 + i
        ids = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(i))
        cap, hooks = {}, []
        for k in theirs:
            hooks.append(model.model.layers[k].register_forward_hook(
                lambda m, a, o, k=k, cap=cap: cap.__setitem__(k, o[0] if isinstance(o, tuple) else o)))
        with torch.no_grad():
            out = model(input_ids=ids[None], output_hidden_states=True)
        for h in hooks:
            h.remove()
        final, aux = out.hidden_states[-1].bfloat16(), torch.cat([cap[k] for k in theirs], -1).bfloat16()
        mask = (torch.arange(n) >= n // 2).long()
        batched = i % 2 == 0
        sample = {"input_ids": ids if batched else ids[None], "loss_mask": mask,
                  "hidden_state": final if batched else final[0], "aux_hidden_state": aux if batched else aux[0]}
        (tmp_path / "sf" / "rows_0-2000").mkdir(parents=True, exist_ok=True)
        torch.save(sample, tmp_path / "sf" / "rows_0-2000" / f"data_{i}.ckpt")
        want[f"rows_0-2000/data_{i}"] = (ids, mask.bool(), out.hidden_states, out.logits[0])

    manifest = import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", val_fraction=0.0)
    assert manifest.aux_layer_ids == [2, L // 2, L - 3] and manifest.dtype == "bfloat16"
    got = FeatureSet(tmp_path / "out").sequences("train")
    assert sorted(s.seq_id for s in got) == sorted(want)
    for s in got:
        ids, mask, hs, logits = want[s.seq_id]
        assert torch.equal(s.input_ids, ids) and torch.equal(s.loss_mask, mask)
        assert torch.equal(s.aux_hidden, torch.cat([hs[j][0] for j in manifest.aux_layer_ids], -1).bfloat16())
        assert torch.equal(s.final_hidden, hs[L][0].bfloat16())
        assert torch.equal((s.final_hidden.float() @ model.lm_head.weight.T).argmax(-1), logits.argmax(-1))


def test_gzipped_samples_import_as_their_plain_copies(random_llama, tmp_path):
    """SpecForge's --compress writes data_<i>.ckpt.gz, which its loader reads beside *.ckpt (a run resumed
    with --compress leaves some of each): they import under the same ids, to the same shards' content."""
    for root, packed in (("plain", ()), ("mixed", (1, 2))):
        (tmp_path / root / "rows_0-2000").mkdir(parents=True)
        for i in range(4):
            buf = io.BytesIO()
            torch.save(_sample(8 + i, seed=i), buf)
            name = tmp_path / root / "rows_0-2000" / f"data_{i}.ckpt"
            if i in packed:
                name.with_name(name.name + ".gz").write_bytes(gzip.compress(buf.getvalue()))
            else:
                name.write_bytes(buf.getvalue())
        import_specforge(tmp_path / root, random_llama, tmp_path / f"{root}-out", val_fraction=0.25)
    plain, mixed = (FeatureSet(tmp_path / f"{r}-out") for r in ("plain", "mixed"))
    for split in ("train", "val"):
        a, b = plain.sequences(split), mixed.sequences(split)
        assert [s.seq_id for s in a] == [s.seq_id for s in b] and len(a) > 0
        for x, y in zip(a, b):
            assert all(torch.equal(getattr(x, k), getattr(y, k))
                       for k in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"))

    twice = tmp_path / "mixed" / "rows_0-2000" / "data_0.ckpt.gz"
    twice.write_bytes(gzip.compress((tmp_path / "mixed" / "rows_0-2000" / "data_0.ckpt").read_bytes()))
    with pytest.raises(LabError, match="data_0.ckpt and rows_0-2000/data_0.ckpt.gz are one sample, gzipped and not"):
        import_specforge(tmp_path / "mixed", random_llama, tmp_path / "again", val_fraction=0.25)
    twice.unlink()
    broken = tmp_path / "mixed" / "rows_0-2000" / "data_1.ckpt.gz"
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.raises(LabError) as e:
        import_specforge(tmp_path / "mixed", random_llama, tmp_path / "again", val_fraction=0.25)
    assert str(e.value).startswith(f"{broken}: cannot read as a gzipped SpecForge sample") and "\n" not in str(e.value)
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(LabError, match="cannot read as a gzipped SpecForge sample"):
        import_specforge(tmp_path / "mixed", random_llama, tmp_path / "again", val_fraction=0.25)


def test_a_dangling_link_is_one_line_naming_it(random_llama, tmp_path):
    (tmp_path / "sf").mkdir()
    torch.save(_sample(8), tmp_path / "sf" / "data_0.ckpt")
    (tmp_path / "sf" / "data_1.ckpt").symlink_to(tmp_path / "gone.ckpt")
    with pytest.raises(LabError) as e:
        import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", val_fraction=0.0)
    assert str(tmp_path / "sf" / "data_1.ckpt") in str(e.value) and "\n" not in str(e.value)


def test_a_directory_named_ckpt_is_walked_not_read(random_llama, tmp_path):
    """As SpecForge's loader (os.walk, files only) does: its files import, the directory is no sample."""
    (tmp_path / "sf" / "run.ckpt" / "rows_0-2000").mkdir(parents=True)
    torch.save(_sample(8), tmp_path / "sf" / "data_0.ckpt")
    torch.save(_sample(7, seed=1), tmp_path / "sf" / "run.ckpt" / "rows_0-2000" / "data_1.ckpt")
    manifest = import_specforge(tmp_path / "sf", random_llama, tmp_path / "out", val_fraction=0.0)
    assert manifest.source["files"] == 2 and manifest.counts("train")["tokens"] == 15


def test_resume_after_sigkill_writes_the_same_shards(random_llama, tmp_path):
    src = tmp_path / "sf"
    for i in range(9):
        (src / f"rows_{i // 4 * 4}-{i // 4 * 4 + 4}").mkdir(parents=True, exist_ok=True)
        torch.save(_sample(5 + i, seed=i), src / f"rows_{i // 4 * 4}-{i // 4 * 4 + 4}" / f"data_{i}.ckpt")
    import_specforge(src, random_llama, tmp_path / "ref", val_fraction=0.3, shard_size=2)
    out = tmp_path / "out"
    killer = (  # SIGKILL at the 5th sample read (the first is the probe): a shard has landed, the next is a temp
        "import os, signal\nimport drafter_lab.data.specforge as sf\nreal, n = sf.read_sample, [0]\n"
        "def read(*a, **k):\n    n[0] += 1\n    if n[0] == 5:\n        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*a, **k)\nsf.read_sample = read\n"
        f"sf.import_specforge({str(src)!r}, {str(random_llama)!r}, {str(out)!r}, val_fraction=0.3, shard_size=2)\n")
    run = subprocess.run([sys.executable, "-c", killer], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert len(list(out.glob(".*.tmp"))) == 1 and len(list(out.glob("*.safetensors"))) == 1
    import_specforge(src, random_llama, out, val_fraction=0.3, shard_size=2)
    assert not list(out.glob(".*"))
    assert {p.name: p.read_bytes() for p in out.glob("*.safetensors")} == {
        p.name: p.read_bytes() for p in (tmp_path / "ref").glob("*.safetensors")}
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (tmp_path / "ref", out))
    a["source"].pop("dir"), b["source"].pop("dir")
    assert a == b
