"""Review s63: a bad count names the flag typed and its value, one bad value a line: bench verify, replay,
draft-forward and allreduce; `vocab build --size` is refused before the features are read (its upper bound,
the target's vocab, from their manifest before the count); `served_evaluate` names the one setting it
refuses, with its value."""

from __future__ import annotations

import pytest

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.kernels import bench_allreduce, bench_draft_forward
from drafter_lab.spec import bench_verify, served
from drafter_lab.train import bench_replay


@pytest.mark.parametrize("argv,message", [
    (["--context", "0"], "--context must be >= 1, got 0"),
    (["--reps", "0"], "--reps must be >= 1, got 0"),
    (["--extend-tokens", "-2"], "--extend-tokens must be >= 1, got -2"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--threads", "-1"], "--threads must be >= 0, got -1"),
])
def test_bench_verify_names_the_flag_and_value(argv, message):
    # was "--context, --reps and --extend-tokens must be >= 1, --warmup and --threads >= 0", whichever it was
    with pytest.raises(LabError) as e:
        bench_verify.parse(["--target", "no-such-target", *argv])
    assert str(e.value) == message


@pytest.mark.parametrize("argv,message", [(["--steps", "0"], "--steps must be >= 1, got 0"),
                                          (["--reps", "-3"], "--reps must be >= 1, got -3")])
def test_bench_replay_names_the_flag_and_value(argv, message):
    with pytest.raises(LabError) as e:  # was "--steps and --reps must be >= 1"
        bench_replay.parse(["--device", "cpu", *argv])
    assert str(e.value) == message


@pytest.mark.parametrize("argv,message", [
    (["--warmup", "-1"], "--warmup -1: must be >= 0"),  # was "--warmup -1: must be >= 1 (--warmup >= 0)"
    (["--batch", "1", "0", "--context", "0"], "--context 0: must be >= 1"),  # one value, not a list of them
])
def test_bench_draft_forward_one_clear_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench_draft_forward.parse(["--device", "cpu", *argv])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err == f"drafter-lab bench draft-forward: error: {message}"


@pytest.mark.parametrize("argv,message", [
    (["--sizes", "1024", "0", "2048"], "--sizes must be at least 1, got 0"),  # was "got 1024 0 2048"
    (["--ranks", "2", "4", "99"], "--ranks must be in 1..16, got 99"),
])
def test_bench_allreduce_names_the_bad_values_only(argv, message):
    with pytest.raises(LabError) as e:
        bench_allreduce.main(["--backends", "cpu", *argv])
    assert str(e.value) == message


@pytest.fixture
def no_count(monkeypatch):
    def count(*args, **kwargs):
        raise AssertionError("the train split was counted: --size should have been refused first")

    monkeypatch.setattr("drafter_lab.data.vocab.count_train_tokens", count)


def test_vocab_build_size_below_one_refused_first(tmp_path, capsys, no_count):
    # was "draft vocab size 0 must be in 1..V" after the count; now before even a missing --data is noticed
    argv = ["vocab", "build", "--data", str(tmp_path / "missing"), "--size", "0", "--out", str(tmp_path / "v.st")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "error: --size must be >= 1, got 0\n"


def test_vocab_build_size_past_the_target_vocab_refused_before_the_count(stdlib_features, tmp_path, capsys,
                                                                         no_count):
    from drafter_lab.data.shards import FeatureSet

    most = int(FeatureSet(stdlib_features).manifest.target["vocab_size"])
    argv = ["vocab", "build", "--data", str(stdlib_features), "--size", str(most + 1), "--out", str(tmp_path / "v.st")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"error: --size must be in 1..{most} (the target vocab size), got {most + 1}\n"


@pytest.mark.parametrize("field,value,message", [
    ("concurrency", 0, "concurrency must be >= 1, got 0"),
    ("max_new_tokens", -1, "max_new_tokens must be >= 1, got -1"),
    ("temperature", float("nan"), "temperature must be a finite number >= 0, got nan"),
])
def test_served_evaluate_names_the_setting_and_value(field, value, message):
    # was "need concurrency >= 1, max_new_tokens >= 1 and a finite temperature >= 0, got ..." for any of them
    cfg = served.ServedConfig(url="http://127.0.0.1:9", **{field: value})
    with pytest.raises(LabError) as e:
        served.served_evaluate(None, [], cfg)
    assert str(e.value) == message


def test_eval_server_concurrency_zero_refused_at_the_command_line(tmp_path, capsys):
    """Guard (passes before the fix too): --concurrency 0 never reaches served_evaluate."""
    argv = ["eval", "--server", "http://127.0.0.1:9", "--target", str(tmp_path / "t"), "--prompts",
            str(tmp_path / "p.jsonl"), "--concurrency", "0"]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "argument --concurrency: expected positive integers, got '0'" in capsys.readouterr().err


def test_served_evaluate_names_retries_as_its_field():
    with pytest.raises(LabError) as e:  # a library caller set no flag
        served.served_evaluate(None, [], served.ServedConfig(url="http://127.0.0.1:9", retries=-1))
    assert str(e.value) == "retries must be >= 0, got -1"


def test_eval_server_negative_retries_refused_before_the_prompts_are_read(tmp_path, capsys):
    # was refused by served_evaluate, after the tokenizer loaded: here the missing prompts file was named first
    argv = ["eval", "--server", "http://127.0.0.1:9", "--target", str(tmp_path / "t"), "--prompts",
            str(tmp_path / "missing.jsonl"), "--retries", "-1"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == "error: --retries must be >= 0, got -1\n"
