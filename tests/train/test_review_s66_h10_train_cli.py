"""Review s66 (h10): what `train` on the command line hands train() (each online flag, --resume, --no-remap,
an explicit transfer scale of 0, --val-data), the flags refused on a features run or without --stop-if-behind,
its exit status and the rank that prints, and which of a --config file and a flag a refusal names."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main

TRAIN = ["train", "--target", "no-target", "--out", "no-out"]  # train() is replaced: nothing is read


def test_each_online_flag_reaches_the_capture_settings(trained):
    assert main([*TRAIN, "--conversations", "c.jsonl", "--target-dtype", "bfloat16", "--aux-layer-ids", "1,2,3",
                 "--val-fraction", "0.25", "--token-exact", "--chat-template-kwargs", '{"enable_thinking": false}',
                 "--turns", "last", "--tokenize-workers", "3", "--val-data", "v.jsonl"]) == 0
    [call] = trained
    online = call["online"]
    assert (online.dtype, online.aux_layer_ids, online.val_fraction, online.token_exact, online.chat_template_kwargs,
            online.turns, online.tokenize_workers) == ("bfloat16", [1, 2, 3], 0.25, True, {"enable_thinking": False},
                                                       "last", 3)
    assert (call["data"], call["val_data"]) == ("c.jsonl", "v.jsonl")


def test_a_features_run_hands_train_its_inputs_and_no_capture_settings(trained):
    assert main([*TRAIN, "--data", "d", "--resume", "--init-from", "src", "--no-remap", "--val-data", "v"]) == 0
    [call] = trained
    assert (call["data"], call["online"], call["resume"], call["init_from"], call["remap"], call["val_data"]) == (
        "d", None, True, "src", False, "v")
    assert "l2sp" not in call and "transfer_lr_scale" not in call  # train()'s defaults


def test_a_transfer_lr_scale_of_zero_is_passed_not_dropped(trained):
    """0 freezes the transferred weights: dropped as falsy, they trained at the full rate (train()'s 1)."""
    assert main([*TRAIN, "--data", "d", "--init-from", "src", "--transfer-lr-scale", "0", "--l2sp", "0"]) == 0
    assert (trained[0]["transfer_lr_scale"], trained[0]["l2sp"]) == (0.0, 0.0)


@pytest.mark.parametrize("flag", [["--target-dtype", "bfloat16"], ["--aux-layer-ids", "1,2,3"], ["--token-exact"],
                                  ["--chat-template-kwargs", "{}"], ["--turns", "last"], ["--val-fraction", "0.5"]])
def test_an_online_flag_on_a_features_run_is_refused(trained, cli_error, flag):
    assert cli_error([*TRAIN, "--data", "d", *flag]) == f"error: {flag[0]} applies to --conversations (online) runs only"
    assert trained == []


def test_watch_settings_without_stop_if_behind_are_refused(trained, cli_error):
    assert cli_error([*TRAIN, "--data", "d", "--watch-window", "4"]) == (
        "error: --watch-window applies with --stop-if-behind only")
    assert trained == []


@pytest.mark.parametrize("watch_step, code", [(None, 0), (3, 0), (5, 3)])
def test_exit_status_3_only_where_the_watch_stopped_the_run_at_its_last_step(trained, tmp_path, watch_step, code):
    """A run its watch never stopped (or stopped at an earlier step, then resumed past it) exits 0."""
    (tmp_path / "no-out").mkdir()
    if watch_step is not None:
        (tmp_path / "no-out" / "watch.json").write_text(json.dumps({"step": watch_step}))
    assert main([*TRAIN, "--data", "d", "--stop-if-behind", "base"]) == code


@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False)])
def test_only_rank_0_prints_the_result(trained, monkeypatch, capsys, rank, printed):
    monkeypatch.setenv("RANK", rank)
    assert main([*TRAIN, "--data", "d"]) == 0
    out = capsys.readouterr().out
    assert (json.loads(out) == {"step": 5, "loss_0": 1.0}) if printed else out == ""


def test_a_flags_bad_value_is_named_by_the_flag_though_the_file_is_bad_too(trained, tmp_path, cli_error):
    """The flag's complaint comes first, and the file's fields put back to their defaults draw it still: it
    is the flag's, not the file's."""
    f = tmp_path / "train.toml"
    f.write_text("min_lr_ratio = 2\n")
    assert cli_error([*TRAIN, "--data", "d", "--config", str(f), "--lr", "-1"]) == (
        "error: --lr must be >= 0 and finite, got -1.0")


def test_a_files_nan_names_the_file(trained, tmp_path, cli_error):
    """nan != nan: the file's value was not recognised as the file's, and the refusal named no file."""
    f = tmp_path / "train.toml"
    f.write_text("lr = nan\n")
    assert cli_error([*TRAIN, "--data", "d", "--config", str(f)]) == (
        f"error: {f}: lr must be >= 0 and finite, got nan")


@pytest.mark.parametrize("follow", ["inf", "-1", "nan"])
def test_watch_refuses_a_follow_that_is_not_a_finite_number_of_seconds(tmp_path, cli_error, follow):
    """inf passed, and time.sleep's OverflowError came after the first check."""
    assert cli_error(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", follow]) == (
        f"error: --follow must be a finite number of seconds >= 0, got {float(follow)}")


def test_watch_without_follow_refuses_a_run_with_no_metrics_at_once(tmp_path, monkeypatch, cli_error):
    """Only --follow waits for a run still starting up; without it the check is once, now."""
    import time

    def sleep(seconds):
        raise AssertionError("waited for the run")

    monkeypatch.setattr(time, "sleep", sleep)
    (tmp_path / "run").mkdir()
    assert cli_error(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]) == (
        f"error: {tmp_path / 'run'}: no metrics.jsonl: not a training run directory")


def _runs(tmp_path, steps, total=None) -> list[str]:
    """A run and its baseline with equal val cond_acc_0 at `steps` (the run's run.json with `total`)."""
    for name in ("run", "base"):
        (tmp_path / name).mkdir()
        rows = [{"event": "val", "split": "val", "step": s, "train_tokens": 100 * s, "cond_acc_0": 0.5 + s / 1000}
                for s in steps]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if total is not None:
        (tmp_path / "run" / "run.json").write_text(json.dumps({"total_steps": total}))
    return ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]


def test_watch_json_says_a_run_at_its_last_step_has_finished(tmp_path, capsys):
    argv = _runs(tmp_path, [100, 200, 300], total=300)
    assert main([*argv, "--json", "--watch-axis", "train_tokens"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["finished"], said["axis"]) == (True, "train_tokens")
    assert main(argv) == 0
    assert "the run has finished (300 steps): its last validation is not judged" in capsys.readouterr().out
    (tmp_path / "more").mkdir()
    assert main([*_runs(tmp_path / "more", [100, 200], total=300), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is False


def test_watch_table_shows_the_last_ten_matched_validations(tmp_path, capsys):
    argv = _runs(tmp_path, range(1, 13))
    assert main(argv) == 0
    steps = [cells[0] for line in capsys.readouterr().out.splitlines()
             if len(cells := line.replace("│", " ").split()) == 4 and cells[0].isdigit()]
    assert steps == [str(s) for s in range(3, 13)]


def test_watch_of_a_run_with_a_verdict_file_but_no_validations_yet_is_no_traceback(tmp_path, capsys):
    """rows[-1] of no rows: an IndexError where the run's own watch.json is there before any validation."""
    argv = _runs(tmp_path, [])
    (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 3}))
    assert main(argv) == 0
    assert "own watch stopped it" not in capsys.readouterr().out
