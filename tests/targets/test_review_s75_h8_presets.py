"""Review s75 (h8) of targets/presets.py: the presets that read the whole snapshot (tiny-cpu, gpu-small) get
a corpus with training conversations left after their held-out parts, tiny-cpu's is the one the README's
numbers were measured on, and its model is the one the README names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from drafter_lab.targets import corpus as c
from drafter_lab.targets.presets import PRESETS

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def every():
    return c.source_files()


def _corpus(cfg, files):
    return c.build_corpus(files, seed=cfg.seed, shifted_share=cfg.shifted_share,
                          heldout_per_slice=cfg.heldout_per_slice, max_source_chars=cfg.max_source_chars)


@pytest.mark.parametrize("name", ["tiny-cpu", "gpu-small"])
def test_a_full_snapshot_preset_reads_every_file_and_trains_on_both_slices(name, every):
    """corpus_max_files 0 is every file: one file would leave both slices "too small" once `targets build` ran.
    tiny-cpu's counts are pinned: the README's tiny-cpu timings and acceptance figures are of this corpus, and
    a change to a setting it reads (max_source_chars, shifted_share, the prompt counts) changes them."""
    cfg = PRESETS[name]
    assert c.source_files(cfg.corpus_max_files) == every
    corpus = _corpus(cfg, every)
    assert min(len(corpus.base), len(corpus.shifted)) > 1000
    assert len(corpus.heldout_base) == len(corpus.heldout_shifted) == cfg.heldout_per_slice
    if name == "tiny-cpu":
        assert corpus.summary()["conversations"] == {"base": 2838, "shifted": 1399, "heldout_base": 200,
                                                     "heldout_shifted": 200}


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_built_without_drift_runs_its_whole_fine_tune(name):
    """The README's `--drift` "1 = the preset's fine-tune": left out, a build runs tune_steps, no more."""
    cfg = PRESETS[name]
    assert round(cfg.drift * cfg.tune_steps) == cfg.tune_steps > 0


def test_the_tiny_cpu_model_is_the_one_the_readme_names():
    said = re.search(r"--preset tiny-cpu .*?\((GQA), (\d+) layers\)", README.read_text())
    cfg = PRESETS["tiny-cpu"]
    assert said and int(said.group(2)) == cfg.num_layers
    assert cfg.num_kv_heads < cfg.num_heads  # GQA
