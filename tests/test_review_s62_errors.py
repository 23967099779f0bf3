"""Review s62, errors a reader meets walking the README: a resume refused for its validation set names
--val-data and both sets; a directory that holds no model or tokenizer is named before transformers is
asked; an empty conversations file says so; the benchmarks' usage names the command that ran them."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main
from drafter_lab.data.capture import CaptureConfig, prepare_features
from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train

CFG = TrainConfig(draft_vocab_size=64, max_steps=1, batch_size=8, ttt_steps=2, log_every=1, eval_every=1,
                  eval_batch_size=8, threads=1, max_length=64)


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "{" not in text, text  # no dict of hashes
    return text


@pytest.fixture(scope="module")
def val_sets(random_llama, conversations_writer, tmp_path_factory):
    """Two validation feature directories, of other conversations than stdlib_features'."""
    root = tmp_path_factory.mktemp("val_sets")
    out = []
    for name, module in (("val_a", "shlex.py"), ("val_b", "fnmatch.py")):
        convs = conversations_writer(root / f"{name}.jsonl", 8, module=module)
        prepare_features(random_llama, convs, root / name, max_length=64, val_fraction=0.25, batch_size=16)
        out.append(root / name)
    return out


def test_a_resume_refused_for_its_validation_set_names_the_flag_and_both_sets(random_llama, stdlib_features,
                                                                             val_sets, tmp_path):
    """Was "--resume with other validation data ({'manifest_sha256': ..., 'val': {...}} there, {...} now)"."""
    a, b = val_sets
    out = tmp_path / "run"
    train(CFG, random_llama, stdlib_features, out, val_data=a)
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, stdlib_features, out, resume=True)
    assert _one_line(e).endswith(f"the run validated on --val-data {a}; this resume gives none: pass --val-data {a}")
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, stdlib_features, out, resume=True, val_data=b)
    assert _one_line(e).endswith(f"the run validated on --val-data {a}; this resume gives --val-data {b}: "
                                 f"pass --val-data {a}")
    (out / "run.json").unlink()  # the set's path is its record's: without it, said without one
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, stdlib_features, out, resume=True)
    assert _one_line(e).endswith("the run validated on a --val-data of its own; this resume gives none: "
                                 "pass the --val-data it validated on")
    plain = tmp_path / "plain"
    train(CFG, random_llama, stdlib_features, plain)
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, stdlib_features, plain, resume=True, val_data=a)
    assert _one_line(e).endswith(f"the run validated on its data's val split; this resume gives --val-data {a}: "
                                 "leave --val-data out")


def test_a_validation_set_changed_in_place_is_named(random_llama, stdlib_features, val_sets, tmp_path):
    a, _ = val_sets
    moved = tmp_path / "val"
    moved.mkdir()
    for f in a.iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "run"
    train(CFG, random_llama, stdlib_features, out, val_data=moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    (moved / "manifest.json").write_text(json.dumps({**manifest, "skipped": {"no_assistant_turn": 7}}))
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, stdlib_features, out, resume=True, val_data=moved)
    assert _one_line(e).endswith(f"--val-data {moved} holds other data than when the run validated on it: "
                                 "the run would not be the same")


def test_an_online_resume_without_its_validation_file_is_refused_for_validation(random_llama, conversations_writer,
                                                                               tmp_path):
    """An online run's encoding hash covers its validation sequences: a resume without the --val-data file
    was refused as "other training data"."""
    convs = conversations_writer(tmp_path / "convs.jsonl", 16)
    held = conversations_writer(tmp_path / "held.jsonl", 6, module="shlex.py")
    online = CaptureConfig(max_length=64, val_fraction=0.25)
    out = tmp_path / "run"
    train(CFG, random_llama, convs, out, online=online, val_data=held)
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, convs, out, online=online, resume=True)
    assert _one_line(e).endswith(f"the run validated on --val-data {held}; this resume gives none: "
                                 f"pass --val-data {held}")


@pytest.fixture
def not_models(tmp_path, stdlib_features):
    empty = tmp_path / "empty"
    empty.mkdir()
    drafter_like = tmp_path / "drafter"  # a config.json, but no tokenizer
    drafter_like.mkdir()
    (drafter_like / "config.json").write_text("{}")
    return {empty: "no config.json and no tokenizer files", stdlib_features: "no config.json and no tokenizer files",
            drafter_like: "no tokenizer files"}


def test_a_directory_without_a_tokenizer_is_named_before_transformers_is_asked(not_models, monkeypatch):
    """Was transformers' "Couldn't instantiate the backend tokenizer ... install sentencepiece", cut off."""
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: pytest.fail("transformers was asked"))
    for path, missing in not_models.items():
        with pytest.raises(LabError) as e:
            load_tokenizer(path)
        assert _one_line(e).startswith(f"{path}: ") and missing in str(e.value), str(e.value)


def test_a_target_without_a_tokenizer_is_refused_before_its_weights_load(random_llama, tmp_path, monkeypatch):
    from drafter_lab.targets import hf

    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for f in random_llama.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            (weights_only / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(hf, "model_class", lambda config: pytest.fail("loaded the weights"))
    with pytest.raises(LabError, match="no tokenizer files"):
        hf.load_target(weights_only)


def test_probe_and_transfer_name_a_source_target_that_is_not_a_model(random_llama, stdlib_features, not_models,
                                                                     tmp_path, capsys):
    drafter = tmp_path / "drafter_run"
    train(CFG, random_llama, stdlib_features, drafter)
    for path, missing in not_models.items():
        capsys.readouterr()
        for argv in (["probe", "--drafter", str(drafter), "--target", str(random_llama), "--data",
                      str(stdlib_features), "--source-target", str(path)],
                     ["train", "--target", str(random_llama), "--data", str(stdlib_features), "--init-from",
                      str(drafter), "--source-target", str(path), "--max-steps", "1", "--threads", "1",
                      "--draft-vocab-size", "64", "--out", str(tmp_path / "out")]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err.startswith(f"error: {path}: ") and missing in err and "sentencepiece" not in err, err


def test_every_command_names_a_target_directory_that_is_not_a_model(not_models, stdlib_features, tmp_path, capsys):
    convs = tmp_path / "c.jsonl"
    convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "a"},
                                                   {"role": "assistant", "content": "b"}]}) + "\n")
    for path in (p for p, missing in not_models.items() if "config.json" in missing):
        for argv in (["eval", "--drafter", str(tmp_path), "--target", str(path), "--prompts", str(convs)],
                     ["data", "prepare", "--target", str(path), "--conversations", str(convs), "--out",
                      str(tmp_path / "o1")],
                     ["train", "--target", str(path), "--data", str(stdlib_features), "--out", str(tmp_path / "o2")],
                     ["probe", "--drafter", str(tmp_path), "--target", str(path), "--data", str(stdlib_features)],
                     ["bench", "verify", "--target", str(path)]):
            capsys.readouterr()
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err.startswith(f"error: {path}: ") and "config.json" in err, (argv, err)


@pytest.mark.parametrize("text", ["", "\n\n  \n", "[]"])
def test_an_empty_conversations_file_says_it_holds_none(random_llama, tmp_path, text):
    """Was "no conversation with an assistant turn (skipped: {})", as if it held unanswered ones."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text(text)
    with pytest.raises(LabError) as e:
        read_conversations(empty)
    assert _one_line(e) == f"{empty}: holds no conversations"
    with pytest.raises(LabError) as e:
        train(CFG, random_llama, empty, tmp_path / "run", online=CaptureConfig(max_length=64))
    assert _one_line(e) == f"{empty}: holds no conversations"
    with pytest.raises(LabError) as e:
        prepare_features(random_llama, empty, tmp_path / "features", max_length=64)
    assert _one_line(e) == f"{empty}: holds no conversations"


@pytest.mark.parametrize("name", ["allreduce", "draft-forward", "verify", "replay"])
def test_a_benchmarks_usage_names_the_command_that_runs_it(name, capsys):
    with pytest.raises(SystemExit):
        main(["bench", name, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: drafter-lab bench {name} ")
