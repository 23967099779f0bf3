"""Review s63: a setting refused by a check names the flag typed (`--val-fraction must be ...`, not
`val_fraction ...`), and is refused before the command's inputs are read: data import-specforge, targets
build --drift, costmodel, eval, data regenerate, export; a seed past torch's 64 bits is refused in one line,
not a traceback; and probe refuses a wrong --source-target before it reads the held-out features or loads
the drafter."""

from __future__ import annotations

import json
import shutil

import pytest

from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.experiments import probe as probe_mod


@pytest.fixture
def no_build(monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("the pair was built: the command line should have been refused first")

    monkeypatch.setattr("drafter_lab.targets.build.build_pair", build)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "a", "conversations": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    return path


IMPORT = ["data", "import-specforge", "--hidden-states", "no-states", "--target", "no-target", "--out", "no-out"]
EVAL = ["eval", "--ngram", "--target", "no-target", "--prompts", "no-prompts.jsonl"]  # checked before they are read
REGEN = ["data", "regenerate", "--conversations", "no.jsonl", "--out", "regen.jsonl"]


@pytest.mark.parametrize("argv, message", [
    # was "need 0 <= val_fraction < 1 and shard_size >= 1", once the hidden states were listed
    ([*IMPORT, "--val-fraction", "2"], "--val-fraction must be in [0, 1), got 2.0"),
    ([*IMPORT, "--shard-size", "0"], "--shard-size must be at least 1, got 0"),
    # the command's own option, which build_pair applied: "drift must be ..."
    (["targets", "build", "--out", "no-out", "--drift", "inf"], "--drift must be >= 0 and finite, got inf"),
    (["targets", "build", "--out", "no-out", "--drift", "1e308", "--tune-steps", "5"],
     "--drift 1e+308 x --tune-steps 5 is past any number of fine-tune steps"),
    # checked in report(), after every --inputs file was read
    (["costmodel", "--inputs", "no-inputs.json", "--num-layers", "0"], "--num-layers must be a finite number > 0, got 0"),
    (["costmodel", "--inputs", "no-inputs.json", "--no-draft-share", "1"], "--no-draft-share must be in [0, 1), got 1.0"),
    # "need steps >= 1, topk >= 1, max_new_tokens >= 1 (got 4, 1, 0)" once the target had loaded
    ([*EVAL, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    ([*EVAL, "--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["eval", "--server", "http://127.0.0.1:9", "--target", "t", "--prompts", "p.jsonl", "--temperature", "-1"],
     "--temperature must be a finite number >= 0, got -1.0"),  # was at the first request, with concurrency's
    # "need max_new_tokens >= 1, batch_size >= 1 ..." (its flag is --batch-size) once the conversations were read
    ([*REGEN, "--target", "t", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    ([*REGEN, "--target", "t", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    ([*REGEN, "--server", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency must be >= 1, got 0"),
    ([*REGEN, "--server", "http://127.0.0.1:9", "--retries", "-1"], "--retries must be >= 0, got -1"),
    # "drift levels must be ...", which no flag or config key spells
    (["experiment", "--runs", "runs", "--drift-levels", "0.5,-1"], "--drift-levels must be >= 0 and finite, got -1.0"),
    (["experiment", "--runs", "runs", "--drift-levels", "1,0.5,1"], "--drift-levels repeat: 1, 0.5, 1"),
    # "speculative_tokens must be at least 1", once the drafter was read
    (["export", "--drafter", "no-drafter", "--format", "speculators", "--out", "no-out", "--speculative-tokens", "0"],
     "--speculative-tokens must be at least 1, got 0"),
    # a seed past torch's 64 bits: a ValueError traceback where the first generator was seeded
    *[(argv + ["--seed", str(2**64)], f"--seed must be in -2**63..2**64-1 (torch's 64-bit seeds), got {2**64}")
      for argv in (EVAL, ["bench", "verify", "--target", "no-target"], ["bench", "replay"], [*REGEN, "--target", "t"],
                   ["data", "prepare", "--target", "t", "--conversations", "c", "--out", "o", "--regenerate"])],
])
def test_a_refused_setting_names_the_flag_before_the_inputs_are_read(tmp_path, monkeypatch, no_build,
                                                                     argv, message, cli_error):
    monkeypatch.chdir(tmp_path)
    assert cli_error(argv) == f"error: {message}"


def test_a_costmodel_flag_that_makes_the_deployment_inconsistent_is_named(cli_error):
    assert cli_error(["costmodel", "--measured-verify-ms", "1", "--verify-allreduce-us", "1000"]).endswith(
        "all-reduces of 1000 us: lower --verify-allreduce-us")


@pytest.mark.parametrize("argv, message", [
    (["--draft-tokens", "50", "--topk", "2"], "--draft-tokens must be in 1..14 for steps=4, topk=2, got 50"),
    (["--ngram-min", "0"], "n-gram sizes need 1 <= --ngram-min <= --ngram-max, got --ngram-min=0, --ngram-max=4"),
])
def test_eval_settings_checked_before_the_target_loads_name_their_flags(prompts, argv, message, cli_error):
    drafting = ["--ngram"] if argv[0].startswith("--ngram") else ["--drafter", "no-drafter"]
    assert cli_error(["eval", *drafting, "--target", "no-target", "--prompts", str(prompts), *argv]) == \
        f"error: {message}"


@pytest.fixture
def no_signals(monkeypatch):
    """The probe's slow reads, failing the test if reached."""
    def read(*args, **kwargs):
        raise AssertionError("the held-out features were read before --source-target was checked")

    monkeypatch.setattr(FeatureSet, "read", read)
    monkeypatch.setattr(probe_mod, "load_drafter", read)


def test_probe_refuses_a_source_target_that_is_no_model_before_the_signals(random_llama, stdlib_features, tmp_path,
                                                                          no_signals):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LabError, match="not a model or tokenizer directory"):
        probe_mod.probe(tmp_path / "drafter", random_llama, stdlib_features, empty)
    tokenizer_only = tmp_path / "tokenizer"
    tokenizer_only.mkdir()
    for f in random_llama.glob("tokenizer*"):
        shutil.copy(f, tokenizer_only)
    with pytest.raises(LabError, match="--source-target holds a tokenizer alone"):
        probe_mod.probe(tmp_path / "drafter", random_llama, stdlib_features, tokenizer_only)


def test_probe_refuses_another_source_target_before_the_signals(random_llama, stdlib_features, no_signals,
                                                              foreign_source_target):
    drafter, other = foreign_source_target
    with pytest.raises(LabError, match=f"--source-target {other} is not the target this drafter was trained on"):
        probe_mod.probe(drafter, random_llama, stdlib_features, other)
