"""`train` end to end on real captured features, transfer through train, and bad input."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.data.shards import FeatureSet, Manifest
from drafter_lab.data.vocab import build_vocab
from drafter_lab.drafter.checkpoint import load_drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.fingerprint import legacy_fingerprint
from drafter_lab.targets.hf import load_target
from drafter_lab.train import state
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.loop import train
from drafter_lab.train.metrics import evaluate
from drafter_lab.train.metrics_log import read_metrics

CFG = TrainConfig(draft_vocab_size=128, epochs=2, batch_size=8, ttt_steps=3, lr=3e-3, warmup_steps=3,
                  log_every=1, eval_every=3, eval_batch_size=8, threads=1)


@pytest.fixture(scope="module")
def trained(peaked_llama, features, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "drafter"
    threads = torch.get_num_threads()
    final = train(CFG, peaked_llama, features, out)
    assert torch.get_num_threads() == threads  # cfg.threads holds for the run only
    return out, final


def test_run_dir_is_a_drafter_with_its_history(trained, peaked_llama, features):
    out, final = trained
    for name in ("config.json", "model.safetensors", "train_state/state.pt", "metrics.jsonl", "run.json"):
        assert (out / name).exists(), name
    rows = read_metrics(out)
    val = [r for r in rows if r["split"] == "val"]
    steps_per_epoch = -(-len(FeatureSet(features).require("train")) // CFG.batch_size)
    assert [r["step"] for r in val] == sorted({*range(3, 2 * steps_per_epoch, 3), steps_per_epoch, 2 * steps_per_epoch})
    for r in rows:
        assert {"event", "step", "epoch", "split", "lr", "train_tokens", "loss_0", "acc_2", "cond_acc_2",
                "simulated_accept_len"} <= set(r)
    assert final == {k: v for k, v in val[-1].items() if k not in ("event", "split", "lr", "elapsed_s", "train_tokens")}
    # Every epoch reads every train sequence once, at its trained length.
    refs = FeatureSet(features).require("train")
    assert val[-1]["train_tokens"] == CFG.epochs * sum(min(len(r), CFG.max_length) for r in refs if len(r) >= 3)

    target = load_target(peaked_llama, tokenizer=False)
    drafter = load_drafter(out)
    assert torch.equal(drafter.d2t, build_vocab(features, CFG.draft_vocab_size).d2t)
    assert torch.equal(drafter.embed_tokens.weight, target.embed_weight())
    assert drafter.config.aux_layer_ids == FeatureSet(features).manifest.aux_layer_ids
    again = evaluate(drafter, target.lm_head_weight(), FeatureSet(features).require("val"), CFG.ttt_steps,
                     CFG.eval_batch_size)
    for k in ("cond_acc_0", "cond_acc_1", "acc_2", "loss_0", "simulated_accept_len"):
        assert again[k] == pytest.approx(final[k], rel=1e-6), k


def test_training_learns(trained, peaked_llama, features):
    out, final = trained
    target = load_target(peaked_llama, tokenizer=False)
    torch.manual_seed(CFG.seed)
    untrained = load_drafter(out)
    from drafter_lab.drafter.model import Eagle3Drafter

    fresh = Eagle3Drafter(untrained.config)
    fresh.load_state_dict({**fresh.state_dict(), "embed_tokens.weight": untrained.embed_tokens.weight,
                           "d2t": untrained.d2t, "t2d": untrained.t2d})
    before = evaluate(fresh, target.lm_head_weight(), FeatureSet(features).require("val"), CFG.ttt_steps)
    assert final["loss_0"] < before["loss_0"] - 0.5
    assert final["cond_acc_0"] > before["cond_acc_0"] + 0.1


def test_transfer_through_train(trained, peaked_llama, features, tmp_path):
    src, _ = trained
    out = tmp_path / "b"
    cfg = TrainConfig(**{**CFG.__dict__, "epochs": 1, "eval_every": 0})
    train(cfg, peaked_llama, features, out, init_from=src, transfer_lr_scale=0.0)
    report = json.loads((out / "transfer.json").read_text())
    assert report["positions_agree"] == report["tokens_shared"] == report["rows_copied"] == 128
    assert report["rows_from_target"] == 0
    a, b = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert torch.equal(a["midlayer.mlp.up_proj.weight"], b["midlayer.mlp.up_proj.weight"])  # lr scale 0: frozen

    def drift(l2sp: float, name: str) -> float:
        train(cfg, peaked_llama, features, tmp_path / name, init_from=src, l2sp=l2sp)
        c = load_file(str(tmp_path / name / "model.safetensors"))
        return float(sum(((c[k] - a[k]) ** 2).sum() for k in a if k.startswith("midlayer.")))

    assert drift(1e4, "d") < 0.5 * drift(0.0, "b0")

    # A resume brings the transfer it began with: the same source weights (wherever they now lie) and settings.
    final = read_metrics(tmp_path / "d")[-1]
    moved = tmp_path / "moved"
    shutil.copytree(src, moved)
    assert train(cfg, peaked_llama, features, tmp_path / "d", resume=True, init_from=moved, l2sp=1e4)["loss_0"] == \
        final["loss_0"]
    saved = state.load(tmp_path / "d")  # as a lab that fingerprinted the source the older way saved it
    saved["init_from"]["source_fingerprint"] = legacy_fingerprint(src)
    state.save(tmp_path / "d", saved)
    assert train(cfg, peaked_llama, features, tmp_path / "d", resume=True, init_from=moved, l2sp=1e4)["loss_0"] == \
        final["loss_0"]
    for kwargs, problem in (({"init_from": src}, "l2sp 10000.0 there, 0.0 now"),
                            ({}, f"init_from {src} there, none now"),  # l2sp without it: refused by itself
                            ({"init_from": src, "l2sp": 1e4, "remap": False}, "remap True there, False now"),
                            ({"init_from": src, "l2sp": 1e4, "transfer_lr_scale": 0.5}, "transfer_lr_scale 1.0 there")):
        with pytest.raises(LabError, match=re.escape(f"--resume with a different transfer ({problem}")):
            train(cfg, peaked_llama, features, tmp_path / "d", resume=True, **kwargs)
    with pytest.raises(LabError, match=re.escape(f"(init_from none there, {moved} now)")):
        train(CFG, peaked_llama, features, src, resume=True, init_from=moved)  # the scratch run
    w = load_file(str(moved / "model.safetensors"))
    save_file({**w, "fc.weight": 2 * w["fc.weight"]}, str(moved / "model.safetensors"))  # other source weights
    with pytest.raises(LabError, match="source_fingerprint"):
        train(cfg, peaked_llama, features, tmp_path / "d", resume=True, init_from=moved, l2sp=1e4)


def test_bad_input_exits_2_and_writes_nothing(trained, peaked_llama, features, tmp_path, capsys):
    base = ["train", "--draft-vocab-size", "64", "--epochs", "1"]

    def run(target, data, *extra):
        out = tmp_path / "out"
        code = main([*base, "--target", str(target), "--data", str(data), "--out", str(out), *extra])
        err = capsys.readouterr().err
        assert code == 2 and not out.exists(), err
        return err

    other = tmp_path / "other-target"  # same weights, another config: another fingerprint
    shutil.copytree(peaked_llama, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5}))
    assert "captured from target" in run(other, features)

    nan = tmp_path / "nan"
    shutil.copytree(features, nan)
    shard = nan / Manifest.load(nan).shards["train"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["aux_hidden"][3, 1] = float("nan")
    save_file(t, str(shard), metadata=meta)
    err = run(peaked_llama, nan)
    assert "NaN or inf" in err and shard.name in err

    empty = tmp_path / "empty"
    shutil.copytree(features, empty)
    m = Manifest.load(empty)
    m.shards["train"] = []  # a capture that planned no train sequences (not a partial one)
    m.source["planned"]["train"] = {"sequences": 0, "shards": 0}
    m.save(empty)
    assert "no train sequences" in run(peaked_llama, empty)

    wide = tmp_path / "wide"
    shutil.copytree(features, wide)
    m = Manifest.load(wide)
    m.target["hidden_size"] = 80
    m.save(wide)
    assert "hidden size 80" in run(peaked_llama, wide)

    src, _ = trained
    broken = tmp_path / "broken"
    shutil.copytree(src, broken, ignore=shutil.ignore_patterns("train_state"))
    w = load_file(str(broken / "model.safetensors"))
    del w["midlayer.self_attn.v_proj.weight"]
    save_file(w, str(broken / "model.safetensors"))
    err = run(peaked_llama, features, "--init-from", str(broken))
    assert "midlayer.self_attn.v_proj.weight" in err and "model.safetensors" in err

    narrow = tmp_path / "narrow"
    shutil.copytree(src, narrow, ignore=shutil.ignore_patterns("train_state"))
    w = load_file(str(narrow / "model.safetensors"))
    w["fc.weight"] = w["fc.weight"][:, :-3].contiguous()  # a drafter made for another target width
    save_file(w, str(narrow / "model.safetensors"))
    assert "fc.weight" in run(peaked_llama, features, "--init-from", str(narrow))


def test_refuses_to_overwrite_or_resume_differently(trained, peaked_llama, features, tmp_path):
    out, _ = trained
    with pytest.raises(LabError, match="already holds a training run"):
        train(CFG, peaked_llama, features, out)
    with pytest.raises(LabError, match="lr"):
        train(TrainConfig(**{**CFG.__dict__, "lr": 1e-3}), peaked_llama, features, out, resume=True)
    other = tmp_path / "features"  # the same shards under a manifest that says something else
    shutil.copytree(features, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["skipped"] = {"no_assistant_turn": 99}
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LabError, match="--resume with other training data"):
        train(CFG, peaked_llama, other, out, resume=True)


def test_resuming_a_finished_run_returns_its_result_and_writes_nothing(trained, peaked_llama, features):
    out, final = trained
    files = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.rglob("*") if f.is_file()}
    assert train(CFG, peaked_llama, features, out, resume=True) == final
    assert {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.rglob("*") if f.is_file()} == files


def test_config_from_toml_and_cli(tmp_path):
    from drafter_lab.cli import build_parser
    from drafter_lab.config import apply_cli_args, field_docs
    from drafter_lab.train.commands import load_config

    assert set(field_docs(TrainConfig)) == set(TrainConfig.__dataclass_fields__)
    (tmp_path / "a.toml").write_text("[train]\nttt_steps = 3\nlr = 0.01\n")
    cfg = load_config(tmp_path / "a.toml")
    assert (cfg.ttt_steps, cfg.lr, cfg.loss_decay) == (3, 0.01, 0.8)
    args = build_parser().parse_args(["train", "--target", "t", "--data", "d", "--out", "o", "--lr", "0.02",
                                      "--batch-tokens", "4096"])
    cfg = apply_cli_args(cfg, args)
    assert (cfg.ttt_steps, cfg.lr, cfg.batch_tokens) == (3, 0.02, 4096)
    (tmp_path / "bad.toml").write_text("ttt_step = 3\n")
    with pytest.raises(LabError, match="ttt_step"):
        load_config(tmp_path / "bad.toml")


def test_drafter_narrower_than_target_learns_its_own_embedding(peaked_llama, features, tmp_path):
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 2, "drafter_hidden_size": 48, "drafter_heads": 4,
                         "drafter_kv_heads": 2})
    train(cfg, peaked_llama, features, tmp_path / "n")
    drafter = load_drafter(tmp_path / "n")
    assert drafter.config.hidden_size == 48 and drafter.config.target_hidden_size == 64
    assert json.loads((tmp_path / "n/config.json").read_text())["target_hidden_size"] == 64
    assert drafter.embed_tokens.weight.shape[1] == 48 and drafter.embed_tokens.weight.abs().sum() > 0
    with pytest.raises(LabError, match="init_lm_head_from_target"):
        train(TrainConfig(**{**cfg.__dict__, "init_lm_head_from_target": True}), peaked_llama, features,
              tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_lm_head_can_start_from_the_target(peaked_llama, features, tmp_path):
    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 1, "lr": 0.0, "warmup_steps": 0,
                         "init_lm_head_from_target": True})
    (tmp_path / "h").mkdir()  # an empty --out is a new one
    train(cfg, peaked_llama, features, tmp_path / "h")
    drafter = load_drafter(tmp_path / "h")
    head = load_target(peaked_llama, tokenizer=False).lm_head_weight()
    assert torch.equal(drafter.lm_head.weight, head[drafter.to_target_ids(torch.arange(CFG.draft_vocab_size))])


def test_drafter_shape_overrides_keep_the_targets_head_dim():
    """A target whose heads x head_dim is not its hidden size (Qwen3-style): overriding only the MLP
    width must keep the target's head_dim, or a drafter mirrored from the target would not fit."""
    from types import SimpleNamespace

    from drafter_lab.train.loop import _drafter_config

    tc = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         intermediate_size=128, vocab_size=300, max_position_embeddings=256, rope_theta=1e4)
    target = SimpleNamespace(config=tc)
    cfg = _drafter_config(TrainConfig(drafter_intermediate_size=96), target, 32, [1, 2, 3])
    assert (cfg.head_dim, cfg.intermediate_size, cfg.hidden_size) == (32, 96, 64)
    assert _drafter_config(TrainConfig(drafter_hidden_size=48), target, 32, [1, 2, 3]).head_dim == 12
    with pytest.raises(LabError, match=r"drafter shape: head_dim 15 is odd: RoPE needs an even one"):  # RoPE turns pairs
        _drafter_config(TrainConfig(drafter_hidden_size=30, drafter_heads=2, drafter_kv_heads=1), target, 32, [1, 2, 3])


def test_a_resume_needs_the_transfer_remapped_the_same_way(tmp_path):
    """A transfer remapped by token string (the targets' tokenizers differ) resumes only so, and a state saved
    before the lab could (it has no remap_by) counts as remapped by id."""
    from drafter_lab.train.loop import _check_resume_transfer

    block = {"source": "src", "source_fingerprint": "ab", "remap": True, "l2sp": 0.0, "transfer_lr_scale": 1.0}
    _check_resume_transfer(block, dict(block), tmp_path)
    by_token = {**block, "remap_by": "token"}
    _check_resume_transfer(by_token, dict(by_token), tmp_path)
    for saved, now, problem in ((block, by_token, "remap_by id there, token now"),
                                (by_token, block, "remap_by token there, id now")):
        with pytest.raises(LabError, match=re.escape(f"--resume with a different transfer ({problem})")):
            _check_resume_transfer(saved, now, tmp_path)


@pytest.mark.parametrize("flags, given", [(["--source-target", "t"], "--source-target applies"),
                                          (["--no-remap"], "--no-remap applies"), (["--l2sp", "0"], "--l2sp applies"),
                                          (["--transfer-lr-scale", "1", "--l2sp", "0.1"],
                                           "--l2sp and --transfer-lr-scale apply")])
def test_transfer_options_need_init_from(tmp_path, capsys, flags, given):
    """Refused even at their defaults: a flag given is a flag the user meant to take effect."""
    assert main(["train", "--target", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o"),
                 *flags]) == 2
    assert capsys.readouterr().err == f"error: {given} with --init-from\n"


@pytest.mark.parametrize("over", [{"l2sp": float("nan")}, {"l2sp": -1.0}, {"transfer_lr_scale": float("inf")},
                                  {"transfer_lr_scale": -0.5}])
def test_transfer_settings_refuse_nan_inf_and_negatives(tmp_path, over):
    with pytest.raises(LabError, match="l2sp and transfer_lr_scale must be >= 0"):  # before the target is loaded
        train(CFG, tmp_path / "t", tmp_path / "d", tmp_path / "o", init_from=tmp_path / "src", **over)


def test_an_out_that_would_spoil_something_is_refused_first(tmp_path, monkeypatch, capsys):
    """The run writes config.json and model.safetensors into --out: never into one of its inputs, a file, or a
    directory of something else. All checked before the target is loaded (there is none here)."""
    monkeypatch.chdir(tmp_path)
    inputs = {"--target": "t", "--data": "d", "--val-data": "v", "--init-from": "src", "--source-target": "st"}
    for path in inputs.values():
        Path(path).mkdir()
        Path(path, "config.json").write_text("{}")
    kwargs = {"val_data": tmp_path / "v", "init_from": tmp_path / "src", "source_target": tmp_path / "st"}
    for flag, path in inputs.items():
        with pytest.raises(LabError, match=f"^{path}: --out is the {flag} path: the run would overwrite it"):
            train(CFG, tmp_path / "t", tmp_path / "d", Path(path), **kwargs)
        assert Path(path, "config.json").read_text() == "{}"
    (tmp_path / "afile").write_text("")
    with pytest.raises(LabError, match="afile: --out is a file"):
        train(CFG, "t", "d", tmp_path / "afile")
    with pytest.raises(LabError, match="d: --out is not empty and holds no training run"):
        train(CFG, "nothing", "nothing", "d")
    assert main(["train", "--target", "t", "--data", "d", "--out", "afile"]) == 2
    assert capsys.readouterr().err.strip() == "error: afile: --out is a file: choose a directory"
    with pytest.raises(LabError, match="^d: --val-data is the --data path: validation would score what the drafter"):
        train(CFG, "t", "d", tmp_path / "new", val_data="./d")


def test_a_run_killed_before_it_logged_is_still_a_run(peaked_llama, features, tmp_path, monkeypatch):
    """A run killed before its first metrics line leaves run.json: its directory is still a run's, which
    --resume begins again (it has no train state)."""
    from drafter_lab.train import loop

    def killed(*a):
        raise KeyboardInterrupt

    cfg = TrainConfig(**{**CFG.__dict__, "max_steps": 2, "log_every": 10, "eval_every": 0})
    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", killed)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, peaked_llama, features, tmp_path / "k")
    assert (tmp_path / "k" / "run.json").exists() and not read_metrics(tmp_path / "k")
    assert train(cfg, peaked_llama, features, tmp_path / "k", resume=True)["step"] == 2


@pytest.mark.parametrize("name", ["meta", pytest.param("gpu", id="gpu-name"), "cuda:x", "mps"])  # not the gpu mark
def test_a_device_a_run_cannot_train_on_is_one_line(name):
    from drafter_lab.train.distributed import pick_device

    with pytest.raises(LabError, match=f"unknown device '{name}': use auto, cpu, cuda or cuda:N"):
        pick_device(name)


def test_cuda_is_taken_only_where_it_is_visible(monkeypatch):
    from drafter_lab.train.distributed import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LabError, match="no CUDA device is visible"):
        pick_device("cuda")
    assert pick_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda", local_rank=1) == torch.device("cuda:1")
    with pytest.raises(LabError, match=r"device 'cuda:2': only 2 CUDA device\(s\) visible"):
        pick_device("cuda:2")
    # one GPU bound per rank (CUDA_VISIBLE_DEVICES): rank 3 of a node trains on the one it sees
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda", local_rank=3) == torch.device("cuda:0")


def test_torchrun_ranks_on_one_node_are_not_all_put_on_one_gpu(monkeypatch):
    """--device cuda:0 under torchrun with 2 ranks a node was NCCL's duplicate-GPU traceback at init."""
    from drafter_lab.train import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed, "_joined", False)  # set by the joins below
    monkeypatch.setattr(distributed.atexit, "register", lambda f: None)
    joined = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: joined.append(dev))
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, device_id: joined.append((backend, device_id)))
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(LabError, match="^--device cuda:0 puts every rank of this node on one GPU"):
        distributed.setup("cuda:0")
    assert joined == []
    assert distributed.setup("cuda").device == torch.device("cuda:1")
    assert joined == [torch.device("cuda:1"), ("nccl", torch.device("cuda:1"))]  # NCCL bound to the rank's GPU
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank a node: GPU 0 of each node is fine
    assert distributed.setup("cuda:0").device == torch.device("cuda:0")


@pytest.mark.parametrize("over", [{"val_temperature": float("nan")}, {"lr": float("nan")},
                                  {"grad_clip": float("inf")}, {"seed": 2**64}, {"seed": -1}])
def test_train_settings_refuse_nan_and_inf(over):
    from drafter_lab.train.config import check_config

    with pytest.raises(LabError, match="must be"):
        check_config(TrainConfig(**over))


def test_a_metrics_file_shorter_than_its_checkpoint_recorded_is_refused(tmp_path):
    """Cutting it back to the checkpoint's size would pad it with NUL bytes, which no reader parses."""
    from drafter_lab.errors import LabError
    from drafter_lab.train.metrics_log import MetricsLog, read_metrics

    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        log.write({"step": step})
    size = (tmp_path / "metrics.jsonl").stat().st_size
    log.write({"step": 3})
    log.truncate(size)  # the lines after the checkpoint go
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(LabError, match="fewer than the .* its checkpoint recorded"):
        log.truncate(size)
    assert b"\0" not in (tmp_path / "metrics.jsonl").read_bytes()


def test_elapsed_time_carries_over_a_resume(peaked_llama, features, tmp_path, monkeypatch):
    """A resumed run's clock goes on from its checkpoint's: metrics.jsonl never shows time going back."""
    from drafter_lab.train import loop

    clock = iter(range(0, 10**6, 100))  # every reading of the run's clock is 100 s after the last
    monkeypatch.setattr(loop, "time", type("Clock", (), {"time": staticmethod(lambda: float(next(clock)))}))
    step = loop._Run.train_step

    def killed_after_5(self, *a):
        step(self, *a)
        if self.step == 5:
            raise KeyboardInterrupt

    cfg = TrainConfig(**{**CFG.__dict__, "checkpoint_every": 2})
    with monkeypatch.context() as m:
        m.setattr(loop._Run, "train_step", killed_after_5)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, peaked_llama, features, tmp_path / "k")
    assert 0 < state.load(tmp_path / "k")["step"] < 5  # the kill lands after a checkpoint
    train(cfg, peaked_llama, features, tmp_path / "k", resume=True)
    elapsed = [r["elapsed_s"] for r in read_metrics(tmp_path / "k")]
    assert elapsed == sorted(elapsed)


def test_a_validation_that_scored_nothing_says_so(peaked_llama, features, tmp_path, capsys):
    """Cut to 4 tokens no val sequence reaches an answer: the printed result stays JSON (an undefined loss
    is null, not NaN) and the summary says nothing was scored instead of showing zero accuracies."""
    assert main(["train", "--target", str(peaked_llama), "--data", str(features), "--out", str(tmp_path / "o"),
                 "--draft-vocab-size", "128", "--epochs", "1", "--max-length", "4", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1], parse_constant=lambda c: pytest.fail(f"{c} in the result"))
    assert result["positions"] == 0 and result["loss_0"] is None
    assert "validation scored no position" in err and "simulated_accept_len=" not in err
