"""Review of `train` and `watch` on the command line: settings refused before train() reads its inputs
(a watch metric the run never logs, an online-only flag on a features run), the token axis's column in
the watch's table, and what a follow says while the run keeps training."""

from __future__ import annotations


def _train(tmp_path, *flags) -> list[str]:
    return ["train", "--target", str(tmp_path / "t"), "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
            *flags]


def test_a_watch_metric_the_run_never_logs_is_refused_before_train(tmp_path, no_training, cli_error):
    """cond_acc_7 is a metric name, but a run of ttt_steps 5 logs none: train refused it only after the
    features' scan and the target's load."""
    said = cli_error(_train(tmp_path, "--stop-if-behind", str(tmp_path / "base"), "--watch-metric", "cond_acc_7"))
    assert said.startswith("error: --watch-metric: 'cond_acc_7' is not a validation metric; one of loss_0,")


def test_tokenize_workers_on_a_features_run_is_refused(tmp_path, no_training, cli_error):
    """Features are already tokenized: the flag alone was silently unused."""
    assert cli_error(_train(tmp_path, "--tokenize-workers", "3")).endswith(
        "applies to --conversations (online) runs only")


def _runs(tmp_path, run: dict[int, float], base: dict[int, float]) -> list[str]:
    import json

    for name, points in (("run", run), ("base", base)):
        (tmp_path / name).mkdir()
        rows = [{"event": "val", "split": "val", "step": s, "train_tokens": 100 * s, "cond_acc_0": v}
                for s, v in points.items()]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["watch", str(tmp_path / "run"), "--baseline", str(tmp_path / "base")]


def test_the_token_axis_table_shows_each_rows_training_tokens(tmp_path, capsys):
    from drafter_lab.cli import main

    argv = _runs(tmp_path, {100: 0.5, 200: 0.6, 300: 0.7}, {100: 0.5, 200: 0.6, 300: 0.7})
    assert main([*argv, "--watch-axis", "train_tokens"]) == 0
    rows = [line.replace("│", " ").split() for line in capsys.readouterr().out.splitlines() if "0.7000" in line]
    assert rows == [["300", "30,000", "0.7000", "0.7000", "+0.0000"]]


def test_follow_reports_the_latest_matched_step_once_while_it_keeps_training(tmp_path, capsys, monkeypatch):
    import json
    import time

    from drafter_lab.cli import main

    argv = _runs(tmp_path, {100: 0.5, 200: 0.6, 300: 0.7}, {100: 0.5, 200: 0.6, 300: 0.7})

    slept = []

    def sleep(seconds):  # two checks with nothing new, then the run's own watch stops it
        slept.append(seconds)
        if len(slept) == 2:
            (tmp_path / "run" / "watch.json").write_text(json.dumps({"step": 300}))

    monkeypatch.setattr(time, "sleep", sleep)
    assert main([*argv, "--follow", "5"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert slept == [5.0, 5.0]
    assert len(said) == 1 and said[0].startswith("step 300: keep training (")  # said once, not at each check


def test_a_draft_configs_head_dim_other_than_hidden_over_heads_is_taken(random_llama, tmp_path):
    """Qwen3-style attention (head_dim 128 at hidden 2048 and 32 heads): the width derived from the
    hidden size and heads made another drafter than the config's."""
    import json

    from drafter_lab.train.commands import with_draft_config
    from drafter_lab.train.config import TrainConfig

    target = json.loads((random_llama / "config.json").read_text())
    path = tmp_path / "eagle3.json"
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": 32, "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 24, "vocab_size": target["vocab_size"], "draft_vocab_size": 100,
        "rope_theta": target.get("rope_theta") or target["rope_parameters"]["rope_theta"], "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "hidden_act": "silu", "tie_word_embeddings": False}))
    cfg = with_draft_config(TrainConfig(), path, random_llama)
    assert (cfg.drafter_hidden_size, cfg.drafter_heads, cfg.drafter_kv_heads, cfg.drafter_head_dim) == (32, 2, 1, 24)
