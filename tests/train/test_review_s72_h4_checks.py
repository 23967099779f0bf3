"""train.loop's small checks, each at its edges (review s72, h4): no target, no run."""

from __future__ import annotations

import contextlib
import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import _autocast, _check_resume_vocab_size, _drafter_config


def _target(**over):
    fields = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=300,
                  max_position_embeddings=256, rope_theta=1e4)
    return SimpleNamespace(config=SimpleNamespace(**{**fields, **over}))


def test_a_narrower_drafter_takes_four_times_its_width_as_its_mlp():
    """The target's MLP width fits only the target's hidden size: another width gets 4x its own, as a
    Llama MLP would; given heads alone keep the target's width and its MLP."""
    narrow = _drafter_config(TrainConfig(drafter_hidden_size=48), _target(), 32, [1, 2, 3])
    assert (narrow.hidden_size, narrow.intermediate_size, narrow.num_key_value_heads) == (48, 192, 2)
    same = _drafter_config(TrainConfig(drafter_heads=8), _target(), 32, [1, 2, 3])
    assert (same.hidden_size, same.intermediate_size, same.head_dim) == (64, 128, 8)
    # the target's own heads, and no head_dim in its config: hidden / heads
    assert _drafter_config(TrainConfig(drafter_intermediate_size=96), _target(), 32, [1, 2, 3]).head_dim == 16


@pytest.mark.parametrize("max_length, target_max, expected", [(1024, 256, 1024), (128, 256, 256), (128, None, 128)])
def test_the_drafter_covers_the_longer_of_its_training_and_the_targets_positions(max_length, target_max, expected):
    """max_position_embeddings: the target's where it is longer (a server drafts along the target's context),
    max_length where training runs past it, and max_length alone where the target gives none."""
    target = _target(max_position_embeddings=target_max)
    if target_max is None:  # a config without the field
        del target.config.max_position_embeddings
    cfg = _drafter_config(TrainConfig(max_length=max_length), target, 32, [1, 2, 3])
    assert cfg.max_position_embeddings == expected


def test_only_a_cuda_device_under_bf16_autocasts():
    """A CPU run never autocasts (bf16 or not), a CUDA one only with bf16, and then to bfloat16."""
    for device, bf16 in (("cpu", True), ("cpu", False), ("cuda", False)):
        assert isinstance(_autocast(torch.device(device), bf16), contextlib.nullcontext), (device, bf16)
    with warnings.catch_warnings():  # a host without CUDA makes it disabled, with a warning
        warnings.simplefilter("ignore")
        cast = _autocast(torch.device("cuda"), True)
    assert (type(cast), cast.device, cast.fast_dtype) == (torch.autocast, "cuda", torch.bfloat16)


def test_a_resume_may_build_a_vocab_of_the_whole_target(tmp_path):
    """A draft vocab as large as the target's is one a run may have begun with: built, then compared."""
    _check_resume_vocab_size({"d2t": torch.zeros(512, dtype=torch.long)}, 512, 512, tmp_path)


@pytest.mark.parametrize("saved, there", [({"d2t": torch.zeros(100, dtype=torch.long)}, "d2t has 100 draft ids there; "),
                                          ({}, "")])
def test_a_resume_size_past_the_target_names_the_vocab(tmp_path, saved, there):
    """One past it is refused naming the run's vocab (its d2t's size, where the state holds one)."""
    said = (f"{tmp_path}: --resume with another draft vocab ({there}draft_vocab_size 513 now is more than the "
            "target's 512 tokens): its lm_head rows were trained for the one it began with; give that vocab "
            "(--vocab with the run's directory reads it), or begin the run again")
    with pytest.raises(LabError, match=f"^{re.escape(said)}$"):
        _check_resume_vocab_size(saved, 513, 512, tmp_path)


LENGTHS = [5, 9, 3, 7, 11, 4, 6]  # 45 tokens, 7 sequences: batches of 3 are 3, 3 and 1


@pytest.mark.parametrize("max_steps, steps", [(0, 6), (1, 1), (5, 5), (6, 6), (7, 6)])
def test_the_plan_counts_every_epochs_batches_up_to_max_steps(max_steps, steps):
    """Two epochs of 3 batches: 6 steps reading 90 tokens, cut at max_steps (0: no cap; past the plan: no cap)."""
    from drafter_lab.train.data import plan_epoch
    from drafter_lab.train.loop import _planned

    cfg = TrainConfig(batch_size=3, epochs=2, max_steps=max_steps, seed=5)
    batches = [b for e in range(2) for b in plan_epoch(LENGTHS, 3, 0, 5, e)]
    assert _planned(cfg, LENGTHS) == (steps, sum(LENGTHS[i] for b in batches[:steps] for i in b))


@pytest.mark.parametrize("epoch, cursor", [(0, 0), (0, 2), (1, 0), (1, 1), (2, 3)])
def test_a_resume_recounts_the_tokens_read_before_its_batch(epoch, cursor):
    """Every batch of the epochs before, then the first `cursor` of its own (the plan differs by epoch)."""
    from drafter_lab.train.data import plan_epoch
    from drafter_lab.train.loop import _tokens_before

    cfg = TrainConfig(batch_size=3, epochs=3, seed=5)
    read = [b for e in range(epoch) for b in plan_epoch(LENGTHS, 3, 0, 5, e)] + plan_epoch(LENGTHS, 3, 0, 5, epoch)[:cursor]
    assert _tokens_before(cfg, LENGTHS, epoch, cursor) == sum(LENGTHS[i] for b in read for i in b)


@pytest.mark.parametrize("temperature, sampled_at, replays", [(0.5, 0.5, True), (0.5, 0.8, False), (0.5, None, False),
                                                              (0.0, 0.0, False), (0.0, None, False), (1.0, 1.0, True)])
def test_validation_replays_only_text_sampled_at_its_own_temperature(temperature, sampled_at, replays):
    """Greedy validation never replays, even of text recorded as sampled at 0."""
    from drafter_lab.train.loop import _replays

    assert _replays(temperature, sampled_at, False) is replays


def _counted(tmp_path, counts):
    """What _load_vocab reads of a run's source: where its data is, and its train split's token counts."""
    return SimpleNamespace(where=tmp_path / "data", token_counts=lambda: counts)


def test_a_vocab_built_from_the_data_takes_its_most_counted_tokens(tmp_path):
    from drafter_lab.train.loop import _load_vocab

    counts = torch.tensor([0, 5, 1, 9, 0, 7])
    _, d2t, t2d = _load_vocab(None, _counted(tmp_path, counts), 3, 6)
    assert (torch.arange(3) + d2t).tolist() == [1, 3, 5] and t2d.tolist() == [False, True, False, True, False, True]
    with pytest.raises(LabError, match=f"^{re.escape(str(tmp_path / 'data'))}: draft vocab maps a 6-token target vocab, "
                                       "the target has 7$"):
        _load_vocab(None, _counted(tmp_path, counts), 3, 7)


def test_a_vocab_that_does_not_fit_names_its_file_or_none(tmp_path):
    """A vocab file is named by its path, not the data's; one given as tensors has no file to name."""
    from drafter_lab.data.vocab import DraftVocab
    from drafter_lab.train.loop import _load_vocab

    source = _counted(tmp_path, None)  # never counted: the vocab is given
    vocab = DraftVocab.from_used(torch.tensor([1, 3]), 6)
    path = tmp_path / "vocab.safetensors"
    vocab.save(path)
    with pytest.raises(LabError, match=f"^{re.escape(str(path))}: draft vocab maps a 6-token target vocab"):
        _load_vocab(path, source, 99, 7)
    with pytest.raises(LabError, match="^draft vocab maps a 6-token target vocab, the target has 7$"):
        _load_vocab(vocab, source, 99, 7)
    twice = DraftVocab(d2t=torch.tensor([1, 0]), t2d=torch.tensor([False, True, True, False, False, False]))
    with pytest.raises(LabError, match="^d2t maps two draft ids to the same target token$"):
        _load_vocab(twice, source, 99, 6)
    assert _load_vocab(path, source, 99, 6)[1].tolist() == vocab.d2t.tolist()


def test_a_resume_from_scratch_or_from_a_source_needs_the_same(tmp_path):
    """Begun from scratch (no block), a resume from a source is refused, and the other way round."""
    from drafter_lab.train.loop import _check_resume_transfer

    block = {"source": "src", "source_fingerprint": "ab", "remap": True, "l2sp": 0.0, "transfer_lr_scale": 1.0}
    _check_resume_transfer(None, None, tmp_path)
    older = {k: v for k, v in block.items() if k != "l2sp"}  # a key a state lacks is None there; only remap_by is "id"
    for saved, now, problem in ((None, block, "init_from none there, src now"), (block, None, "init_from src there, none now"),
                                (older, block, "l2sp None there, 0.0 now")):
        with pytest.raises(LabError, match=f"^{re.escape(f'{tmp_path}: --resume with a different transfer ({problem})')}"):
            _check_resume_transfer(saved, now, tmp_path)


def test_a_given_vocab_whose_t2d_marks_other_than_its_d2t_is_named_inconsistent(tmp_path):
    from drafter_lab.data.vocab import DraftVocab
    from drafter_lab.train.loop import _load_vocab

    short = DraftVocab(d2t=torch.tensor([1]), t2d=torch.tensor([False, True, False, True]))
    with pytest.raises(LabError, match=r"^draft vocab is inconsistent: t2d marks 2 tokens, d2t has 1$"):
        _load_vocab(short, _counted(tmp_path, None), 99, 4)


def test_an_unscanned_sequence_with_an_id_past_the_vocab_is_named_by_its_shard(tmp_path):
    """--scan-features false: each read is checked on the CPU, a bad id naming its shard (a sequence of an
    online run has none) and the sequence; good reads pass through as read."""
    from drafter_lab.data.shards import Sequence, SequenceRef
    from drafter_lab.train.loop import _ids_checked

    def seq(seq_id, ids):
        return Sequence(seq_id, torch.tensor(ids), torch.ones(len(ids)), torch.zeros(len(ids), 1), torch.zeros(len(ids), 1))

    good, bad = seq("a", [1, 2, 9]), seq("b", [1, 10, 2])
    shard = tmp_path / "shard-0.safetensors"
    reads = {"a": good, "b": bad}
    checked = _ids_checked(lambda items: [reads[it.seq_id] for it in items], 10)
    assert checked([SequenceRef(shard, 0, 3, "a")]) == [good]
    with pytest.raises(LabError, match=f"^{re.escape(str(shard))}: token id 10 of sequence b outside the target vocab"):
        checked([SequenceRef(shard, 0, 3, "a"), SequenceRef(shard, 3, 6, "b")])
    online = _ids_checked(lambda items: [reads[i] for i in items], 10)
    with pytest.raises(LabError, match="^token id 10 of sequence b outside the target vocab"):
        online(["b"])


def test_an_out_is_a_run_by_its_metrics_or_its_state_and_never_below_a_file(tmp_path):
    """A run makes metrics.jsonl first, a train state at its first checkpoint: either marks a run (resumed or
    refused later); anything else in a directory is not one, and an --out below a file is refused now."""
    from drafter_lab.train import state
    from drafter_lab.train.loop import _check_out

    for name in ("metrics.jsonl", state.STATE_DIR):
        out = tmp_path / name.replace(".", "_")
        (out / name).mkdir(parents=True)
        _check_out(out, {})
    other = tmp_path / "other"
    (other / "notes.txt").mkdir(parents=True)
    with pytest.raises(LabError, match="--out is not empty and holds no training run"):
        _check_out(other, {})
    (tmp_path / "file").write_text("x")
    with pytest.raises(LabError, match=f"^{re.escape(str(tmp_path / 'file' / 'run'))}: --out lies below a file"):
        _check_out(tmp_path / "file" / "run", {})


def test_a_source_target_is_refused_with_no_remap_only():
    from drafter_lab.train.loop import check_transfer

    check_transfer(None, None, False, None, init_from="src")  # --no-remap alone: the seeds' naive path
    check_transfer(None, None, True, "st", init_from="src")
    with pytest.raises(LabError, match="^--source-target is read for the vocab remap"):
        check_transfer(None, None, False, "st", init_from="src")


def test_the_library_checks_its_settings_before_it_reads_anything(tmp_path):
    """train() called directly (no CLI to check them) refuses a setting first, not as a missing target."""
    from drafter_lab.train.loop import train

    with pytest.raises(LabError, match="^lr must be "):
        train(TrainConfig(lr=float("nan")), tmp_path / "t", tmp_path / "d", tmp_path / "o")
    assert not (tmp_path / "o").exists()
