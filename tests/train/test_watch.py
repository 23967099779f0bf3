"""The watch: a run compared with a baseline at equal steps, by rule (synthetic curves), and applied
by `train --stop-if-behind` and `drafter-lab watch` to real runs."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics_log import read_metrics
from drafter_lab.train.watch import (
    STOP_EXIT,
    WATCH_FILE,
    WatchConfig,
    comparison_note,
    judge,
    replay,
    stopped_at,
    unequal_batches,
    value_at,
)


def curve(points: dict[int, float], metric: str = "cond_acc_0") -> list[dict]:
    return [{"event": "val", "split": "val", "step": s, metric: v} for s, v in points.items()]


BASE = curve({0: 0.0, 100: 0.50, 200: 0.60, 300: 0.66, 400: 0.70, 500: 0.72, 600: 0.73})
W = WatchConfig()


def test_a_run_behind_and_flat_is_stopped():
    run = curve({0: 0.0, 100: 0.55, 200: 0.58, 300: 0.60, 400: 0.61, 500: 0.61})
    v = judge(run, BASE, W, total=2000)
    assert v.stop
    assert [r["step"] for r in v.rows] == [100, 200, 300, 400, 500]
    assert v.rows[-1]["gap"] == pytest.approx(-0.11)
    assert v.reason == ("cond_acc_0 -11.0 points against the baseline at step 500: behind at steps 300 / 400 / 500 "
                        "(-6.0 / -9.0 / -11.0 points), not closing")


def test_a_lead_or_one_validation_within_the_margin_keeps_it_training():
    assert not judge(curve({100: 0.60, 200: 0.70, 300: 0.70}), BASE, W, 2000).stop  # ahead
    v = judge(curve({100: 0.40, 200: 0.595, 300: 0.60}), BASE, W, 2000)  # step 200 within 1 point
    assert not v.stop and "not behind at each" in v.reason


def test_a_closing_gap_keeps_it_training_unless_parity_falls_after_the_run():
    run = curve({200: 0.50, 300: 0.60, 400: 0.68})  # gaps -10 / -6 / -2 points: parity near step 450
    v = judge(run, BASE, W, total=2000)
    assert not v.stop and "closing" in v.reason
    assert v.parity == pytest.approx(450, abs=1)
    late = judge(run, BASE, W, total=420)  # the run ends before it would catch up
    assert late.stop and "closing too slowly (parity near step 450, after the run's 420)" in late.reason


def test_too_early_and_unmatched_steps():
    assert "too early: 2 of 3" in judge(curve({0: 0.0, 100: 0.1, 200: 0.1}), BASE, W, 2000).reason
    # The baseline has not reached steps 700+ yet (it may still be training): they wait.
    run = curve({400: 0.5, 500: 0.5, 700: 0.5, 800: 0.5})
    assert [r["step"] for r in judge(run, BASE, W, 2000).rows] == [400, 500]


def test_baseline_between_its_validations_is_linear():
    base = [(0, 0.0), (100, 0.5), (300, 0.7)]
    assert value_at(base, 200) == pytest.approx(0.6)
    assert value_at(base, 300) == 0.7
    assert value_at(base, 301) is None
    run = curve({150: 0.2, 250: 0.2, 300: 0.2})  # baseline 0.55 / 0.65 / 0.70 there
    assert [r["baseline"] for r in judge(run, BASE[:4], W, 2000).rows] == pytest.approx([0.55, 0.63, 0.66])


def test_losses_count_lower_as_better():
    cfg = dataclasses.replace(W, watch_metric="loss_0", watch_margin=0.05)
    base = curve({100: 3.0, 200: 2.5, 300: 2.2, 400: 2.0}, "loss_0")
    assert judge(curve({200: 2.9, 300: 2.9, 400: 2.9}, "loss_0"), base, cfg, 1000).stop
    assert not judge(curve({200: 2.4, 300: 2.1, 400: 1.9}, "loss_0"), base, cfg, 1000).stop


def test_accept_lengths_read_in_tokens_accuracies_in_points():
    cfg = dataclasses.replace(W, watch_metric="simulated_accept_len", watch_margin=0.05)
    base = curve({100: 1.5, 200: 1.8, 300: 2.0}, "simulated_accept_len")
    v = judge(curve({100: 1.2, 200: 1.3, 300: 1.3}, "simulated_accept_len"), base, cfg, 300)
    assert v.stop and v.reason.startswith("simulated_accept_len -0.7 tokens against the baseline")
    assert "(-0.3 / -0.5 / -0.7 tokens)" in v.reason
    cfg = dataclasses.replace(W, watch_metric="sampled_acc_1")
    v = judge(curve({100: 0.2, 200: 0.2, 300: 0.2}, "sampled_acc_1"), curve({100: 0.5, 200: 0.6, 300: 0.7},
                                                                          "sampled_acc_1"), cfg, 300)
    assert "(-30.0 / -40.0 / -50.0 points)" in v.reason


@pytest.mark.parametrize("margin", [float("nan"), -0.01, float("inf")])
def test_a_margin_that_means_nothing_is_refused(margin):
    with pytest.raises(LabError, match=f"watch_margin must be >= 0, got {margin}"):
        judge([], BASE, dataclasses.replace(W, watch_margin=margin), 2000)


def test_replay_finds_the_first_stop():
    run = curve({0: 0.0, 100: 0.55, 200: 0.58, 300: 0.60, 400: 0.61, 500: 0.61, 600: 0.62})
    v = replay(run, BASE, W, 2000)
    assert v is not None and v.rows[-1]["step"] == 400  # 200, 300, 400 are the first three behind
    assert replay(BASE, BASE, W, 2000) is None


def test_an_unknown_metric_names_the_file():
    with pytest.raises(LabError, match=r"base\.jsonl: no validation metric 'cond_acc_9'"):
        judge(curve({100: 0.1}, "cond_acc_9"), BASE, dataclasses.replace(W, watch_metric="cond_acc_9"), 2000,
              "run.jsonl", "base.jsonl")


def test_the_token_axis_matches_runs_whose_batches_differ():
    cfg = dataclasses.replace(W, watch_axis="train_tokens")
    base = [{**r, "train_tokens": 200 * r["step"]} for r in BASE]  # batches of 200 tokens
    run = [{**r, "train_tokens": 100 * r["step"]} for r in curve({200: 0.50, 400: 0.55, 600: 0.58, 800: 0.60})]
    v = judge(run, base, cfg, total=100 * 2000)
    # Run step 600 read 60,000 tokens: baseline step 300 (0.66); by steps it would be 0.73.
    assert [(r["step"], r["at"]) for r in v.rows] == [(200, 20000), (400, 40000), (600, 60000), (800, 80000)]
    assert [r["baseline"] for r in v.rows] == pytest.approx([0.50, 0.60, 0.66, 0.70])
    assert v.stop and "behind at 40,000 / 60,000 / 80,000 training tokens" in v.reason
    with pytest.raises(LabError, match="do not record 'train_tokens'"):
        judge(curve({100: 0.5}), base, cfg, None, "old.jsonl")
    with pytest.raises(LabError, match="watch_axis must be one of step, train_tokens"):
        judge(run, base, dataclasses.replace(W, watch_axis="epoch"), None)


def test_runs_with_other_batches_are_flagged():
    a, b = {"config": {"batch_size": 8, "batch_tokens": 0}}, {"config": {"batch_size": 16, "batch_tokens": 0}}
    assert unequal_batches(a, a) is None
    assert unequal_batches(a, b) == ("the runs' batches differ (batch_size 8 vs 16): equal steps are not equal data; "
                                     "--watch-axis train_tokens compares equal data")


def test_runs_validated_on_other_sets_are_flagged():
    split = {"config": {"batch_size": 8}, "features": {"manifest_sha256": "aa"}}
    held = {"config": {"batch_size": 8}, "features": {"manifest_sha256": "aa", "val_data": "/v", "val": {"m": "bb"}}}
    other = {"config": {"batch_size": 16}, "features": {"val_data": "/w", "val": {"m": "cc"}}}
    assert comparison_note(held, held, "step") is None and comparison_note(split, split, "step") is None
    assert comparison_note(held, split, "step") == ("the runs validate on different sets (/v vs its data's val split): "
                                                     "their metrics do not compare")
    assert comparison_note(held, other, "train_tokens") == "the runs validate on different sets (/v vs /w): their metrics do not compare"
    assert comparison_note(held, other, "step").startswith("the runs' batches differ (batch_size 8 vs 16)")
    assert comparison_note(held, other, "step").endswith("; the runs validate on different sets (/v vs /w): "
                                                         "their metrics do not compare")
    # Both on their data's val split: equal only when the data are.
    other_data = {"config": {"batch_size": 8}, "features": {"manifest_sha256": "dd", "dir": "/f2"}}
    assert comparison_note({**split, "features": {**split["features"], "dir": "/f1"}}, other_data, "step") == (
        "the runs validate on the val splits of different data (/f1 vs /f2): their metrics do not compare")
    online = {"config": {"batch_size": 8}, "features": {"sha256": "ee", "val_fraction": 0.1, "online": "/c.jsonl"}}
    assert comparison_note(online, online, "step") is None
    resplit = {**online, "features": {**online["features"], "val_fraction": 0.2}}
    assert comparison_note(online, resplit, "step") == ("the runs validate on the val splits of different data "
                                                        "(/c.jsonl: val_fraction 0.1 vs 0.2): their metrics do not compare")
    assert comparison_note(online, split, "step") is None  # online vs captured: the identities do not compare


def test_online_runs_rendered_otherwise_are_flagged():
    def online(**rendering):
        return {"config": {"batch_size": 8}, "features": {"sha256": "ee", "val_fraction": 0.1, "online": "/c.jsonl",
                                                          **rendering}}
    qwen, edited = online(chat_template_sha256="aa"), online(chat_template_sha256="bb")
    assert comparison_note(qwen, qwen, "step") is None
    assert comparison_note(qwen, edited, "step") == (
        "the runs render their conversations otherwise (chat_template_sha256 aa vs bb): they validate on other "
        "text, and their metrics do not compare")
    off = online(chat_template_sha256="aa", chat_template_kwargs={"enable_thinking": False})
    assert comparison_note(off, qwen, "step") == (
        "the runs render their conversations otherwise (chat_template_kwargs {\"enable_thinking\": false} vs none): "
        "they validate on other text, and their metrics do not compare")
    held = {k: {**v, "val": {"sha256": "ff"}, "val_data": "/v.jsonl"} if k == "features" else v for k, v in edited.items()}
    assert comparison_note({**held, "features": {**held["features"], "chat_template_sha256": "aa"}}, held,
                           "step").startswith("the runs render their conversations otherwise")  # a held-out file too
    assert comparison_note(online(), edited, "step") is None  # a run from before templates were recorded
    retokenized = online(chat_template_sha256="aa", tokenizer_sha256="t2")
    assert comparison_note(online(chat_template_sha256="aa", tokenizer_sha256="t1"), retokenized, "step") == (
        "the runs render their conversations otherwise (tokenizer_sha256 t1 vs t2): they validate on other "
        "text, and their metrics do not compare")
    assert comparison_note(qwen, retokenized, "step") is None  # a run from before tokenizers were recorded
    assert comparison_note(edited, retokenized, "step") == (
        "the runs render their conversations otherwise (chat_template_sha256 bb vs aa): they validate on other "
        "text, and their metrics do not compare")  # what both record still counts



def test_online_runs_encoded_otherwise_are_flagged():
    """One file rendered alike, encoded to other sequences: other --turns (each turn a sequence of its
    own), or another lab version's encoding; a held-out feature set, which the hash leaves out, is not."""
    def online(encoded, **settings):
        return {"config": {"batch_size": 8}, "features": {"sha256": "ee", "val_fraction": 0.1, "online": "/c.jsonl",
                                                          "chat_template_sha256": "aa", "encoded_sha256": encoded,
                                                          **settings}}
    every = online("e1")
    assert comparison_note(every, online("e1"), "step") is None
    assert comparison_note(online("e2", turns="each"), every, "step") == (
        "the runs' conversations encode to other sequences (turns each vs none): they validate on other sequences, "
        "and their metrics do not compare")
    assert comparison_note(online("e2"), every, "step") == (
        "the runs' conversations encode to other sequences (the same settings: another lab or transformers "
        "version): they validate on other sequences, and their metrics do not compare")
    assert comparison_note({"features": {k: v for k, v in every["features"].items() if k != "encoded_sha256"}},
                           online("e2"), "train_tokens") is None  # a run from before encodings were recorded
    held = {"val": {"manifest_sha256": "ff"}, "val_data": "/v"}
    assert comparison_note(online("e2", turns="each", **held), online("e1", **held), "step") is None

def test_a_half_written_last_line_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "los')
    assert read_metrics(path) == [{"step": 1}]


@pytest.mark.parametrize("name, text, problem", [
    ("metrics.jsonl", '{"step": 1}\n{"step": 2, "loss_0": nope}\n', "line 2 is not valid JSON"),
    ("metrics.jsonl", '{"step": 1}\n[1, 2]\n', "line 2 is not a metrics record"),
    ("run.json", '{"config": ', "run.json: not valid JSON"),
    ("run.json", "[]", "not a run record"),
])
def test_a_baseline_run_that_does_not_parse_is_one_line(tmp_path, capsys, name, text, problem):
    """The watch reads a baseline that another process may have written (or broken): no traceback."""
    run = tmp_path / "base"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "val", "cond_acc_0": 0.5}\n')
    (run / name).write_text(text)
    assert main(["watch", str(run), "--baseline", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("text", ['{"step": ', "[]"])
def test_a_broken_verdict_is_one_line(tmp_path, text):
    (tmp_path / WATCH_FILE).write_text(text)
    with pytest.raises(LabError, match=WATCH_FILE):
        stopped_at(tmp_path)


@pytest.mark.parametrize("text", ["[]", '{"metric": "loss_0"}'])
def test_a_broken_kept_record_is_one_line_at_resume(baseline, peaked_llama, features, tmp_path, text):
    run = tmp_path / "run"
    shutil.copytree(baseline, run)
    (run / "best").mkdir(exist_ok=True)
    (run / "best" / "best.json").write_text(text)
    with pytest.raises(LabError, match="best.json"):
        train(dataclasses.replace(CFG, keep_best="loss_0"), peaked_llama, features, run, resume=True)


# ---- real runs ------------------------------------------------------------------------------------

CFG = TrainConfig(draft_vocab_size=128, epochs=100, max_steps=24, batch_size=8, ttt_steps=2, lr=3e-3,
                  warmup_steps=2, log_every=4, eval_every=4, eval_batch_size=8, threads=1)


@pytest.fixture(scope="module")
def baseline(peaked_llama, features, tmp_path_factory):
    out = tmp_path_factory.mktemp("watch") / "scratch"
    train(CFG, peaked_llama, features, out)
    return out


def _val_steps(run) -> list[int]:
    return [r["step"] for r in read_metrics(run) if r["split"] == "val"]


def test_train_stops_a_run_that_falls_behind_and_resumes_only_without_the_watch(baseline, peaked_llama, features,
                                                                                  tmp_path, capsys):
    out = tmp_path / "frozen"
    args = ["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(out),
            "--draft-vocab-size", "128", "--epochs", "100", "--max-steps", "24", "--batch-size", "8",
            "--ttt-steps", "2", "--lr", "1e-7", "--warmup-steps", "2", "--log-every", "4", "--eval-every", "4",
            "--eval-batch-size", "8", "--threads", "1", "--stop-if-behind", str(baseline)]
    assert main(args) == STOP_EXIT  # at a learning rate of 1e-7 it cannot follow the baseline
    record = json.loads((out / WATCH_FILE).read_text())
    assert record["stop"] and record["step"] == 12 and record["total_steps"] == 24  # validations 4, 8, 12 behind
    assert _val_steps(out) == [4, 8, 12]
    assert [r["step"] for r in record["rows"]] == [4, 8, 12]
    capsys.readouterr()

    assert main(args + ["--resume"]) == STOP_EXIT  # the same watch: nothing more is trained
    assert _val_steps(out) == [4, 8, 12]
    assert main(args[:-2] + ["--resume"]) == 0  # without it the run trains on to its end
    assert _val_steps(out) == [4, 8, 12, 16, 20, 24]

    capsys.readouterr()
    assert main(["watch", str(out), "--baseline", str(baseline), "--json"]) == STOP_EXIT
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["rows"][-1]["step"] == 20 and verdict["note"] is None  # 24 is its last step: not judged


def test_an_equal_run_is_not_stopped(baseline, peaked_llama, features, tmp_path, capsys):
    out = tmp_path / "same"
    train(CFG, peaked_llama, features, out, stop_if_behind=baseline)
    assert _val_steps(out) == _val_steps(baseline) and not (out / WATCH_FILE).exists()
    assert main(["watch", str(out), "--baseline", str(baseline), "--follow", "0.01"]) == 0  # finished: no wait
    assert "keep training" in capsys.readouterr().out


def test_runs_log_training_tokens_and_the_watch_can_align_by_them(baseline, peaked_llama, features, tmp_path,
                                                                   capsys):
    out = tmp_path / "half-batch"
    train(dataclasses.replace(CFG, batch_size=4, max_steps=48, eval_every=8), peaked_llama, features, out)
    rows = read_metrics(out)
    assert [r["train_tokens"] for r in rows] == sorted(r["train_tokens"] for r in rows)  # never decreasing
    assert json.loads((out / "run.json").read_text())["total_tokens"] == rows[-1]["train_tokens"]
    assert main(["watch", str(out), "--baseline", str(baseline), "--json"]) in (0, STOP_EXIT)
    by_step = json.loads(capsys.readouterr().out)
    assert by_step["note"].startswith("the runs' batches differ (batch_size 4 vs 8): equal steps are not equal data")
    assert main(["watch", str(out), "--baseline", str(baseline), "--watch-axis", "train_tokens", "--json"]) in (0, 3)
    by_tokens = json.loads(capsys.readouterr().out)
    assert by_tokens["note"] is None and by_tokens["total"] == rows[-1]["train_tokens"]
    # By steps, only the run's first 24 of 48 have a baseline value; by tokens, every validation the
    # baseline's tokens cover does, each matched where the baseline had read as many tokens.
    reach = max(r["train_tokens"] for r in read_metrics(baseline) if r["split"] == "val")
    val = [r for r in rows if r["split"] == "val" and r["step"] > 0]
    assert [r["step"] for r in by_step["rows"]] == [r["step"] for r in val if r["step"] <= CFG.max_steps]
    assert [r["at"] for r in by_tokens["rows"]] == [r["train_tokens"] for r in val
                                                    if r["train_tokens"] <= reach and r["step"] < 48]  # 48: its last
    assert len(by_tokens["rows"]) > len(by_step["rows"])


def test_bad_watch_input_is_one_line(baseline, peaked_llama, features, tmp_path, capsys):
    with pytest.raises(LabError, match="not a training run directory"):
        train(CFG, peaked_llama, features, tmp_path / "x", stop_if_behind=tmp_path / "nothing")
    with pytest.raises(LabError, match="names the run itself"):
        train(CFG, peaked_llama, features, baseline, resume=True, stop_if_behind=baseline)
    assert not (tmp_path / "x").exists()
    assert main(["watch", str(baseline), "--baseline", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "y"),
                 "--watch-margin", "0.05"]) == 2
    assert "--watch-margin applies with --stop-if-behind only" in capsys.readouterr().err


def test_a_mistyped_watch_metric_is_refused_before_the_baseline_validates(tmp_path):
    """A baseline without a validation yet cannot show the metric missing: the run's own metric names
    do, before the target is loaded (none is here)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "metrics.jsonl").write_text("")
    with pytest.raises(LabError, match="watch_metric: 'cond_acc_9' is not a validation metric; one of loss_0,"):
        train(CFG, tmp_path / "no-target", tmp_path / "no-data", tmp_path / "out", stop_if_behind=base,
              watch=WatchConfig(watch_metric="cond_acc_9"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("late", ["run", "base"])
def test_follow_waits_for_the_run_and_the_baseline_to_start_then_stops_it(tmp_path, capsys, late):
    """Either one started, nothing logged yet (the two are often started together): a baseline without
    its metrics.jsonl ended the follow at once (exit 2) instead of waiting for it."""
    import threading

    def write(run_dir, points):
        run_dir.mkdir(exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(points)))

    curves = {"run": {100: 0.3, 200: 0.3, 300: 0.3}, "base": {100: 0.5, 200: 0.6, 300: 0.66}}
    for name, points in curves.items():
        (tmp_path / name).mkdir()
        if name != late:
            write(tmp_path / name, points)
    later = threading.Timer(0.3, write, (tmp_path / late, curves[late]))
    later.start()
    try:
        assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", "0.05"]) == STOP_EXIT
    finally:
        later.cancel()
    out = capsys.readouterr().out
    assert out.count("waiting for") == 1 and "stop" in out


def test_follow_ends_when_the_runs_own_watch_stopped_it(tmp_path, capsys):
    """A run its own --stop-if-behind stopped logs nothing more: following it waited forever."""
    def write(run_dir, points):
        run_dir.mkdir(exist_ok=True)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve(points)))

    write(tmp_path / "base", {100: 0.5, 200: 0.5, 300: 0.5})
    write(tmp_path / "run", {100: 0.5, 200: 0.5})  # level, so this watch would keep going
    (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 200}))
    assert main(["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base"), "--follow", "0.05"]) == 0
    assert "the run's own watch stopped it at step 200" in capsys.readouterr().out


def test_a_run_without_its_record_is_noted_as_unknown_not_as_other_settings():
    """A baseline that has not written run.json yet read as "batch_size 8 vs None"."""
    info = {"config": {"batch_size": 8}, "features": {"manifest_sha256": "aa"}}
    assert comparison_note(info, {}, "step") == ("the baseline has no run.json yet: whether the batches and "
                                                 "validation sets match is unknown")
    assert comparison_note({}, {}, "train_tokens").startswith("the run and the baseline have no run.json yet")
