"""Real processes, 2 gloo ranks under torchrun: every line of metrics.jsonl equals one process's (the
counts exactly), a rank left without rows neither hangs nor counts, rank 0 alone writes, and bad input
seen by one rank ends the run with its one-line error."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.data.capture import prepare_features
from drafter_lab.data.shards import Manifest

from .conftest import write_conversations
from .test_resume_ddp import TORCHRUN, cli, rows


def finish(proc, timeout: float = 120) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_lines(one, ddp) -> None:
    a, b = rows(one), rows(ddp)
    assert [(r["event"], r["step"]) for r in b] == [(r["event"], r["step"]) for r in a]  # one writer, every line
    for x, y in zip(a, b, strict=True):
        floats = {k for k, v in x.items() if isinstance(v, float)}
        # the counts (positions, train_tokens) exactly: no row dropped or doubled
        assert {k: v for k, v in y.items() if k not in floats} == {k: v for k, v in x.items() if k not in floats}
        assert {k: y[k] for k in floats} == pytest.approx({k: x[k] for k in floats}, rel=1e-4, abs=1e-6, nan_ok=True), x["step"]


@pytest.mark.slow
def test_two_ranks_equal_one_line_for_line_with_an_odd_remainder(peaked_llama, features, tmp_path):
    """31 train sequences in batches of 5: the last batch's one row goes to rank 0, rank 1 joins the
    step on a stand-in that counts nothing. Each rank's half of a batch (B/2) averages to the whole
    batch's gradient, validation sums both ranks' counts, and only rank 0 writes (the drafter kept as
    best too)."""
    assert Manifest.load(features).counts("train")["sequences"] == 31
    before = tree(features)
    extra = ("--batch-size", "5", "--epochs", "2", "--eval-every", "3", "--eval-batch-size", "4",
             "--keep-best", "simulated_accept_len")
    ddp = cli(peaked_llama, features, tmp_path / "ddp", *extra, launcher=TORCHRUN)
    one = cli(peaked_llama, features, tmp_path / "one", *extra)
    out, err = finish(ddp)
    finish(one)
    assert out.count('"step": 14') == 1  # 2 epochs of 7 batches; the result printed once
    assert err.count("train 14/14") == 1, err[-2000:]  # one progress bar, rank 0's

    assert_same_lines(tmp_path / "one", tmp_path / "ddp")
    assert tree(features) == before  # no rank wrote beside the data
    a, b = tree(tmp_path / "one"), tree(tmp_path / "ddp")
    assert sorted(b) == sorted(a)
    for name in ("model.safetensors", "best/model.safetensors"):
        wa, wb = load_file(str(tmp_path / "one" / name)), load_file(str(tmp_path / "ddp" / name))
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_rank_without_rows_neither_hangs_nor_counts(peaked_llama, tmp_path):
    """One train sequence and one val sequence (one shard each): rank 1 has nothing of its own to
    scan, train on or validate, at every step."""
    dirs = []
    for name, seed in (("train", 0), ("val", 3)):
        convs = write_conversations(tmp_path / f"{name}.jsonl", 1, seed=seed)
        prepare_features(peaked_llama, convs, tmp_path / name, max_length=96, val_fraction=0.0)
        dirs.append(tmp_path / name)
    assert Manifest.load(dirs[0]).counts("train")["sequences"] == 1
    extra = ("--val-data", str(dirs[1]), "--epochs", "3", "--eval-at-start", "true", "--accumulation-steps", "2")
    ddp = cli(peaked_llama, dirs[0], tmp_path / "ddp", *extra, launcher=TORCHRUN)
    one = cli(peaked_llama, dirs[0], tmp_path / "one", *extra)
    finish(ddp)
    finish(one)
    assert_same_lines(tmp_path / "one", tmp_path / "ddp")
    assert rows(tmp_path / "ddp")[-1]["positions"] > 0


@pytest.mark.slow
def test_bad_input_only_rank_1_reads_ends_the_run(peaked_llama, features, tmp_path):
    """The ranks split the shards they check: a truncated val shard is rank 1's alone, while rank 0
    waits for it in the first collective. The run ends with rank 1's one-line error and writes nothing."""
    data = tmp_path / "data"
    shutil.copytree(features, data)
    val = data / Manifest.load(data).shards["val"][0]["file"]
    val.write_bytes(val.read_bytes()[:-100])
    proc = cli(peaked_llama, data, tmp_path / "out", launcher=TORCHRUN)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"error: {val}: truncated or corrupt feature shard" in err
    assert not (tmp_path / "out").exists()
