"""The study regenerates and captures its features on its own device, and keys them by device type."""

from __future__ import annotations

import pytest
import torch

from drafter_lab import atomic
from drafter_lab.data.regenerate import SAMPLER
from drafter_lab.experiments import study
from drafter_lab.experiments.config import ExperimentConfig


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A target directory, prompts, and a prepare_features that records its settings and makes `out`."""
    target = tmp_path / "pair" / "tuned"
    target.mkdir(parents=True)
    prompts = tmp_path / "pair" / "prompts-train.jsonl"
    prompts.write_text('{"id": "c0"}\n')
    monkeypatch.setattr("drafter_lab.targets.fingerprint.fingerprint", lambda p: "fp-new")
    monkeypatch.setattr("drafter_lab.targets.fingerprint.legacy_fingerprint", lambda p: "fp-old")
    calls = []

    def fake_prepare(target_dir, prompts_path, out, **kwargs):
        calls.append(kwargs)
        out.mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(study, "prepare_features", fake_prepare)
    return target, prompts, tmp_path / "cache", calls


def _gpu(monkeypatch, seen: list | None = None):
    """Resolve every device name as a CUDA device, as on a GPU box (without touching torch.cuda)."""
    def resolve(name):
        if seen is not None:
            seen.append(name)
        return torch.device("cuda" if name == "auto" else name)
    monkeypatch.setattr(study, "resolve_device", resolve, raising=False)  # raising: the unfixed study has none


def _key(cache, fp, prompts, cfg, *on):
    """The features' directory: with no `on`, the key features had before the study captured them on its
    device, which CPU features keep."""
    settings = dict(max_length=cfg.max_length, regenerate=True, temperature=cfg.regen_temperature,
                    max_new_tokens=cfg.max_new_tokens, regen_batch_size=cfg.regen_batch_size, seed=cfg.seed)
    return cache / "features" / atomic.sha256_json([fp, atomic.sha256_file(prompts), settings, SAMPLER,
                                                    study.CUT_ANSWERS, *on])[:16]


def test_features_capture_on_the_studys_resolved_device(setup, monkeypatch):
    target, prompts, cache, calls = setup
    seen = []
    _gpu(monkeypatch, seen)
    study._features(target, prompts, cache, ExperimentConfig(name="t"))  # device "auto"
    assert seen == ["auto"]
    assert calls[-1]["device"] == "cuda"
    study._features(target, prompts, cache, ExperimentConfig(name="t", device="cuda:1"))
    assert calls[-1]["device"] == "cuda:1"


def test_cpu_features_keep_their_key_and_run_on_the_cpu(setup):
    target, prompts, cache, calls = setup
    cfg = ExperimentConfig(name="t", device="cpu")
    out = study._features(target, prompts, cache, cfg)
    assert out == _key(cache, "fp-new", prompts, cfg)
    assert calls[-1]["device"] == "cpu"


def test_cuda_features_get_their_own_key_by_device_type(setup, monkeypatch):
    target, prompts, cache, _ = setup
    cpu = study._features(target, prompts, cache, ExperimentConfig(name="t", device="cpu"))
    _gpu(monkeypatch)
    cuda0 = study._features(target, prompts, cache, ExperimentConfig(name="t", device="cuda:0"))
    cuda1 = study._features(target, prompts, cache, ExperimentConfig(name="t", device="cuda:1"))
    assert cuda0 != cpu  # CPU-made features are not reused as the GPU's
    assert cuda1 == cuda0  # the type, not the index


def test_legacy_named_features_are_found_per_device_type(setup, monkeypatch):
    target, prompts, cache, _ = setup
    cfg = ExperimentConfig(name="t", device="cpu")
    legacy_cpu = _key(cache, "fp-old", prompts, cfg)
    legacy_cpu.mkdir(parents=True)
    assert study._features(target, prompts, cache, cfg) == legacy_cpu
    _gpu(monkeypatch)
    cuda = study._features(target, prompts, cache, ExperimentConfig(name="t", device="cuda"))
    assert cuda not in (legacy_cpu, _key(cache, "fp-new", prompts, cfg))
    cuda.rmdir()
    assert cuda == _key(cache, "fp-new", prompts, cfg, "cuda")
    legacy_cuda = _key(cache, "fp-old", prompts, cfg, "cuda")
    legacy_cuda.mkdir()
    assert study._features(target, prompts, cache, ExperimentConfig(name="t", device="cuda")) == legacy_cuda


@pytest.mark.parametrize("fp", ["fp-new", "fp-old"])
def test_features_cached_before_cut_answers_were_recorded_are_not_reused(setup, fp):
    """They trained the end token after answers cut at max_new_tokens: the same settings capture other
    masks now (study.CUT_ANSWERS)."""
    target, prompts, cache, calls = setup
    cfg = ExperimentConfig(name="t", device="cpu")
    settings = dict(max_length=cfg.max_length, regenerate=True, temperature=cfg.regen_temperature,
                    max_new_tokens=cfg.max_new_tokens, regen_batch_size=cfg.regen_batch_size, seed=cfg.seed)
    before = cache / "features" / atomic.sha256_json([fp, atomic.sha256_file(prompts), settings, SAMPLER])[:16]
    before.mkdir(parents=True)
    assert study._features(target, prompts, cache, cfg) == _key(cache, "fp-new", prompts, cfg) != before
