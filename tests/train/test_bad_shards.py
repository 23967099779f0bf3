"""Feature input `train` and `vocab build` met as a traceback (or a misleading message), refused in one
line naming it."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from drafter_lab.cli import main
from drafter_lab.data.shards import Manifest
from drafter_lab.targets.hf import load_target_head


def _with_bad_ids(features, out, bad: int):
    """A copy of `features` whose first train shard holds `bad` as each sequence's second token (the
    first the drafter embeds; outside the loss mask, where `vocab build`'s count does not look): the
    shard and its sequence ids."""
    shutil.copytree(features, out)
    shard = out / Manifest.load(out).shards["train"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    starts = t["offsets"][:-1] + 1
    assert not t["loss_mask"][starts].any()
    t["input_ids"][starts] = bad
    save_file(t, str(shard), metadata=meta)
    return shard, json.loads(meta["seq_ids"])


def _train(target, data, out, *extra) -> int:
    return main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--draft-vocab-size", "64",
                 "--batch-size", "4", "--max-steps", "2", "--eval-every", "0", "--threads", "1", *extra])


@pytest.mark.parametrize("bad", [999999, -5])
def test_token_id_outside_the_target_vocab(peaked_llama, features, tmp_path, capsys, bad):
    """The scan passed such a shard, then the drafter's embedding raised an IndexError mid-run."""
    shard, seq_ids = _with_bad_ids(features, tmp_path / "feat", bad)
    vocab = load_target_head(peaked_llama).vocab_size
    capsys.readouterr()
    assert _train(peaked_llama, tmp_path / "feat", tmp_path / "scanned") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"error: {shard}: token id {bad} outside the target vocab ({vocab})"
    assert not (tmp_path / "scanned").exists()  # refused before anything is written
    # Unscanned, the batch that holds it is refused before the embedding sees it.
    assert _train(peaked_llama, tmp_path / "feat", tmp_path / "lazy", "--scan-features", "false") == 2
    err = capsys.readouterr().err.strip().splitlines()
    m = re.fullmatch(rf"error: {re.escape(str(shard))}: token id {bad} of sequence (\S+) outside the target vocab "
                     rf"\({vocab}\)", err[-1])
    assert m and m[1] in seq_ids, err


def test_a_file_given_as_a_feature_directory(peaked_llama, tmp_path, capsys):
    file = tmp_path / "convs.jsonl"
    file.write_text("{}\n")
    assert _train(peaked_llama, file, tmp_path / "run") == 2
    assert capsys.readouterr().err.strip() == f"error: {file}: is a file, not a feature directory"
    assert main(["vocab", "build", "--data", str(file), "--size", "8", "--out", str(tmp_path / "v.safetensors")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {file}: is a file, not a feature directory"


def test_vocab_build_names_a_negative_id_itself(features, tmp_path, capsys):
    """A negative id at a loss position was reported as the shard's largest id, a valid one."""
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    shard = out / Manifest.load(out).shards["train"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["input_ids"][t["loss_mask"].bool().nonzero()[0]] = -5
    save_file(t, str(shard), metadata=meta)
    assert main(["vocab", "build", "--data", str(out), "--size", "16", "--out", str(tmp_path / "v.safetensors")]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{shard}: token id -5 outside the target vocab "
                                                    f"({Manifest.load(out).target['vocab_size']})")
