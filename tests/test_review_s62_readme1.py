"""Review of README's "The pieces" (s62, first part): bad inputs answered in the user's own terms."""

from __future__ import annotations

import pytest

from drafter_lab import cli


@pytest.mark.parametrize("typed, said", [
    ("3,1,4", "aux layer ids [3, 1, 4] are not in layer order"),
    ("1,3", "need exactly 3 aux layer ids, got [1, 3]"),
])
def test_import_specforge_names_the_aux_ids_as_typed(random_llama, tmp_path, capsys, typed, said):
    """`--aux-layer-ids` takes SpecForge's ids; a refusal quoted them shifted to ours ([4, 2, 5] for 3,1,4)."""
    (tmp_path / "sf").mkdir()
    (tmp_path / "sf" / "data_0.ckpt").write_bytes(b"")  # refused before any sample is read
    out = tmp_path / "out"
    assert cli.main(["data", "import-specforge", "--hidden-states", str(tmp_path / "sf"), "--target", str(random_llama),
                     "--out", str(out), "--aux-layer-ids", typed]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err and not out.exists()


@pytest.mark.parametrize("below", [False, True])
def test_probe_refuses_a_pilot_dir_that_is_a_file_before_any_work(tmp_path, capsys, monkeypatch, below):
    """A file given as --pilot-dir was refused only once the pilot began, after the probe's signals, as
    "--out lies below a file": a flag the probe does not have."""
    from drafter_lab.experiments import probe

    monkeypatch.setattr(probe, "probe", lambda *a, **k: pytest.fail("the probe ran"))
    afile = tmp_path / "pilot.txt"
    afile.write_text("")
    pilot_dir = afile / "arms" if below else afile
    assert cli.main(["probe", "--drafter", "d", "--target", "t", "--data", "f", "--pilot-dir", str(pilot_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(pilot_dir) in err and "--out" not in err
    assert ("--pilot-dir lies below a file" in err) if below else err.endswith("not a directory")


def test_no_remap_onto_another_draft_vocab_size_names_the_flags(tmp_path):
    """`train --init-from D --no-remap` at another --draft-vocab-size (the default 1024 against a 512-row
    source) blamed the source file: "tensor 'lm_head.weight' has shape (512, 128), the drafter needs (1024, 128)"."""
    import dataclasses

    from drafter.test_transfer import USED_NEW, fresh, source, target_head, vocab  # tests/ is on the path

    from drafter_lab.drafter import formats
    from drafter_lab.drafter.transfer import init_from
    from drafter_lab.errors import LabError

    src, path = source(tmp_path, formats.SGLANG)
    smaller = dataclasses.replace(src.config, draft_vocab_size=30)
    with pytest.raises(LabError, match=r"--no-remap .* 37 draft rows and this run's draft vocab 30: train with "
                                       r"--draft-vocab-size 37"):
        init_from(fresh(smaller), path, target_head(), vocab(USED_NEW[:30]), remap=False)


def test_import_specforge_of_a_sample_file_says_it_is_a_file(random_llama, tmp_path, capsys):
    """One `*.ckpt` given for its directory was "SpecForge hidden-states directory not found"."""
    sample = tmp_path / "data_0.ckpt"
    sample.write_bytes(b"")
    assert cli.main(["data", "import-specforge", "--hidden-states", str(sample), "--target", str(random_llama),
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {sample}: is a file, not a directory: give the directory SpecForge's prepare_hidden_states wrote"
