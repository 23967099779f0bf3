"""Fixtures of the experiment tests: captured features of the session's random Llama, and a study stopped
at its first stage."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def features(random_llama, conversations_writer, tmp_path_factory) -> Path:
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("study-features")
    out = root / "features"
    prepare_features(random_llama, conversations_writer(root / "convs.jsonl", 40), out, max_length=64,
                     val_fraction=0.25, batch_size=12)
    return out


@pytest.fixture(scope="module")
def held_out(random_llama, conversations_writer, tmp_path_factory) -> Path:
    """Features of other conversations (from another stdlib module), both splits a validation set."""
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("held-out-features")
    out = root / "features"
    prepare_features(random_llama, conversations_writer(root / "convs.jsonl", 12, "shlex.py"), out, max_length=64,
                     val_fraction=0.25, batch_size=12)
    return out


@pytest.fixture(scope="module")
def source(random_llama, features, tmp_path_factory) -> Path:
    """A drafter trained a few steps on the random Llama's features: the one a probe is asked about."""
    from drafter_lab.train.config import TrainConfig
    from drafter_lab.train.loop import train

    out = tmp_path_factory.mktemp("probe-source") / "source"
    train(TrainConfig(draft_vocab_size=64, max_steps=4, epochs=10, batch_size=4, ttt_steps=2, warmup_steps=1,
                      log_every=2, threads=1), random_llama, features, out)
    return out


@pytest.fixture(scope="module")
def next_version(random_llama, features, tmp_path_factory) -> tuple[Path, Path]:
    """The same weights with a tokenizer trained on other text (as tests/drafter/test_transfer.py makes one),
    and its features of the same conversations: an id names another token in each target, and the source's
    vocabulary spells some held-out sequences wholly, not all."""
    import shutil

    from drafter_lab.data.capture import prepare_features
    from drafter_lab.targets.corpus import source_files
    from drafter_lab.targets.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("next-version")
    shutil.copytree(random_llama, root / "model")
    texts = [f.data.decode() for f in source_files(max_files=8)]
    train_bpe(texts, 400).save_pretrained(root / "model")
    prepare_features(root / "model", features.parent / "convs.jsonl", root / "features", max_length=64,
                     val_fraction=0.25, batch_size=12)
    return root / "model", root / "features"


class Levels(list):
    """The level directories a study began (`levels`); `Reached`, what beginning one raises."""

    class Reached(Exception):
        """The study got past its checks to its first stage."""


@pytest.fixture
def levels(monkeypatch) -> Levels:
    """study.run_level stood in by one that records its level directory and raises Levels.Reached."""
    from drafter_lab.experiments import study

    seen = Levels()

    def level(cfg, drift, level_dir, cache):
        seen.append(level_dir)
        raise Levels.Reached

    monkeypatch.setattr(study, "run_level", level)
    return seen
