"""SpecForge import behaviours a mutation audit (s66, h9) found unpinned: what the resume check's
listing hash reads, a sample lacking one key, and the settings a resume must keep."""

from __future__ import annotations

import datetime
import gzip
import io
import re

import pytest
import torch

from drafter_lab.data.shards import MANIFEST, FeatureSet
from drafter_lab.data.specforge import _listing_hash, import_specforge, read_sample
from drafter_lab.errors import LabError


def _sample(n=4, hidden=8, **over):
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.arange(1, n + 1), "loss_mask": torch.ones(n, dtype=torch.long),
            "hidden_state": torch.randn(1, n, hidden, generator=g),
            "aux_hidden_state": torch.randn(1, n, 3 * hidden, generator=g), **over}


def test_a_sample_moved_to_another_folder_changes_the_listing_hash(tmp_path):
    """A sample's id, and so its split, is its path below the root: a resume over files moved between
    folders (the same names and bytes) would mix two splits, so the hash must see the folder too."""
    hashes = []
    for folder in ("rows_0", "rows_1"):
        root = tmp_path / folder / "sf"
        (root / folder).mkdir(parents=True)
        torch.save(_sample(), root / folder / "data_0.ckpt")
        hashes.append(_listing_hash(root, [root / folder / "data_0.ckpt"]))
    assert hashes[0] != hashes[1]


@pytest.mark.parametrize("key", ["input_ids", "loss_mask", "hidden_state", "aux_hidden_state"])
def test_a_sample_lacking_one_key_is_one_line_naming_it(tmp_path, key):
    """One missing key is the common case (another writer's file), not a KeyError traceback."""
    sample = _sample()
    del sample[key]
    torch.save(sample, tmp_path / "s.ckpt")
    with pytest.raises(LabError) as e:
        read_sample(tmp_path / "s.ckpt", "s", 8, 100)
    assert str(e.value) == f"{tmp_path / 's.ckpt'}: SpecForge sample lacks [{key!r}]"


def _sf_dir(root, n=2, **over):
    root.mkdir(parents=True)
    for k in range(n):
        torch.save(_sample(**over), root / f"s{k}.ckpt")
    return root


def test_only_ckpt_and_ckpt_gz_files_are_samples(tiny_target, tmp_path):
    """The walk matches `*.ckpt*`; what else lies beside the samples (a copy's .ckpt.bak, a partial
    download's .ckpt.part, notes) is no sample: read, it would refuse the whole import."""
    src = _sf_dir(tmp_path / "sf")
    (src / "s0.ckpt.bak").write_bytes((src / "s0.ckpt").read_bytes())
    (src / "s1.ckpt.part").write_bytes(b"half a file")
    (src / "index.ckpt.txt").write_text("notes")
    manifest = import_specforge(src, tiny_target, tmp_path / "out", val_fraction=0.0)
    assert manifest.source["files"] == 2
    assert sorted(s.seq_id for s in FeatureSet(tmp_path / "out").sequences("train")) == ["s0", "s1"]


@pytest.mark.parametrize("typed", [[0, 1], [2]])
def test_fewer_than_three_aux_ids_are_refused_as_typed(tiny_target, tmp_path, typed):
    """The drafter's fc takes three layers' states, as SpecForge's aux_hidden_state holds three."""
    with pytest.raises(LabError, match=re.escape(f"need exactly 3 aux layer ids, got {typed}")):
        import_specforge(_sf_dir(tmp_path / "sf"), tiny_target, tmp_path / "out", aux_layer_ids=typed)


def test_hidden_states_of_a_dtype_the_shards_cannot_hold_are_refused(tiny_target, tmp_path):
    """float64 states (a script that saved them upcast) name the dtypes the shards hold, before any is written."""
    src = _sf_dir(tmp_path / "sf", hidden_state=torch.zeros(1, 4, 8, dtype=torch.float64),
                  aux_hidden_state=torch.zeros(1, 4, 24, dtype=torch.float64))
    with pytest.raises(LabError) as e:
        import_specforge(src, tiny_target, tmp_path / "out")
    assert str(e.value) == (f"{src / 's0.ckpt'}: hidden states are torch.float64; expected one of "
                            "float32, bfloat16, float16")
    assert not (tmp_path / "out" / MANIFEST).exists()


@pytest.mark.parametrize("change", [{"val_fraction": 0.0}, {"shard_size": 1}])
def test_a_rerun_with_another_split_or_shard_size_is_refused(tiny_target, tmp_path, change):
    """A resume keeps the split and the shard plan: another --val-fraction or --shard-size over the
    same --out would mix two plans' shards, so it is refused naming the setting."""
    src = _sf_dir(tmp_path / "sf", n=4)
    first = {"val_fraction": 0.5, "shard_size": 2}
    import_specforge(src, tiny_target, tmp_path / "out", **first)
    (key, value), = change.items()
    with pytest.raises(LabError) as e:
        import_specforge(src, tiny_target, tmp_path / "out", **{**first, **change})
    assert str(e.value).startswith(f"{tmp_path / 'out' / MANIFEST}: manifest was made with other settings "
                                   f"({key}: {first[key]!r} there, {value!r} now)"), str(e.value)
    again = import_specforge(src, tiny_target, tmp_path / "out", **first)  # the same settings resume
    assert again.source["val_fraction"] == 0.5


@pytest.mark.parametrize("name", ["s.ckpt", "s.ckpt.gz"])
def test_a_pickle_beyond_tensors_is_refused_unread(tmp_path, name):
    """Downloaded hidden states load with weights_only: a pickle holding other objects (which a full
    unpickle would construct, code and all) is refused naming the file, not imported; gzipped too."""
    buf = io.BytesIO()
    torch.save({**_sample(), "made": datetime.date(2026, 1, 1)}, buf)
    (tmp_path / name).write_bytes(gzip.compress(buf.getvalue()) if name.endswith(".gz") else buf.getvalue())
    with pytest.raises(LabError, match=re.escape(f"{tmp_path / name}: cannot read as a SpecForge sample (")):
        read_sample(tmp_path / name, "s", 8, 100)


@pytest.mark.parametrize("settings, message", [
    ({"val_fraction": 1.0}, "val_fraction must be in [0, 1), got 1.0"),
    ({"shard_size": 0}, "shard_size must be"),
])
def test_the_split_and_shard_size_are_refused_before_any_file_is_read(tmp_path, settings, message):
    """Called as a library (the CLI checks its flags itself): no directory, no target is looked at first."""
    with pytest.raises(LabError, match=re.escape(message)):
        import_specforge(tmp_path / "absent", tmp_path / "no-target", tmp_path / "out", **settings)


def test_a_missing_directory_is_named_as_missing(tmp_path):
    with pytest.raises(LabError, match=re.escape(f"{tmp_path / 'absent'}: SpecForge hidden-states directory not found")):
        import_specforge(tmp_path / "absent", tmp_path / "no-target", tmp_path / "out")


def test_an_out_dir_holding_other_files_is_refused_untouched(tiny_target, tmp_path):
    """--out pointed at a directory of something else (no manifest) must not get shards written among its files."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(LabError, match="output directory holds other files \\(notes.txt\\) and no manifest"):
        import_specforge(_sf_dir(tmp_path / "sf"), tiny_target, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
