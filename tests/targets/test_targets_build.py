"""build_pair on the `micro` preset: loadable HF pair, shared tokenizer, caching, drift knob, atomicity."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.targets import build as build_mod
from drafter_lab.targets.build import PRESETS, build_pair
from drafter_lab.targets.hf import load_target


def _no_training(*args, **kwargs):
    raise AssertionError("train_lm ran although the result was cached")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("target_cache")


@pytest.fixture(scope="module")
def pair(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("pair") / "micro"
    return out, build_pair("micro", out, drift=1.0, cache_dir=cache)


def test_pair_loads_through_transformers(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    out, info = pair
    for name in ("base", "tuned"):
        model = AutoModelForCausalLM.from_pretrained(out / name)
        tok = AutoTokenizer.from_pretrained(out / name)
        cfg = model.config
        assert isinstance(model, LlamaForCausalLM)
        assert cfg.num_hidden_layers >= 8 and cfg.num_key_value_heads < cfg.num_attention_heads
        assert cfg.tie_word_embeddings is False
        assert tok.chat_template and "<|im_start|>" in tok.chat_template
        text = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        assert text.endswith("<|im_start|>assistant\n")
        assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
        target = load_target(out / name)
        assert target.fingerprint == info[name]["fingerprint"]
    # K2 and K2.5 share one tokenizer.
    assert (out / "base" / "tokenizer.json").read_bytes() == (out / "tuned" / "tokenizer.json").read_bytes()


def test_load_target_hides_transformers_bars(pair, capfd):
    capfd.readouterr()
    load_target(pair[0] / "tuned")
    assert "Loading weights" not in capfd.readouterr().err  # one bar per load floods logs


def test_pair_json_and_prompt_files(pair):
    out, info = pair
    assert json.loads((out / "pair.json").read_text())["key"] == info["key"]
    assert info["preset"] == "micro" and info["config"] == {
        **dataclasses.asdict(PRESETS["micro"]),
        "drift": 1.0,
    }
    assert info["aux_layer_ids"] == [2, 4, 5]
    assert info["base"]["train"]["steps"] == PRESETS["micro"].base_steps
    assert info["tuned"]["train"]["steps"] == PRESETS["micro"].tune_steps
    train = [json.loads(line) for line in (out / "prompts-train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (out / "prompts-eval.jsonl").read_text().splitlines()]
    cfg = PRESETS["micro"]
    assert (len(train), len(evals)) == (cfg.train_prompts, cfg.eval_prompts)
    assert {r["slice"] for r in train} == {r["slice"] for r in evals} == {"base", "shifted"}
    assert not {r["id"] for r in train} & {r["id"] for r in evals}
    assert all([m["role"] for m in r["conversations"]] == ["user", "assistant"] for r in train + evals)


def test_drift_is_positive_and_training_lowered_loss(pair):
    _, info = pair
    figs = info["drift_figures"]
    for part in ("all", "base_text", "shifted_text"):
        assert figs[part]["kl"] > 0
        assert min(figs[part]["cka"]) < 0.9999
        assert len(figs[part]["cka"]) == PRESETS["micro"].num_layers + 1
    train = info["base"]["train"]
    assert train["final_loss"] < train["first_loss"]


def test_second_call_is_cached(pair, cache, monkeypatch):
    out, info = pair
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    again = build_pair("micro", out, drift=1.0, cache_dir=cache)
    assert again["key"] == info["key"] and again["tuned"]["fingerprint"] == info["tuned"]["fingerprint"]
    # A pair a lab naming targets otherwise wrote: the run records the names every other record uses.
    written = json.loads((out / "pair.json").read_text())
    (out / "pair.json").write_text(json.dumps({**written, "base": {**written["base"], "fingerprint": "0123456789abcdef"}}))
    assert build_pair("micro", out, drift=1.0, cache_dir=cache)["base"]["fingerprint"] == info["base"]["fingerprint"]
    (out / "pair.json").write_text(json.dumps(written))
    # A new out_dir is assembled from the cache without training either.
    other = build_pair("micro", out.parent / "copy", drift=1.0, cache_dir=cache)
    assert other["key"] == info["key"] and (out.parent / "copy" / "tuned" / "model.safetensors").exists()


def test_drift_zero_reuses_base_and_copies_it(pair, cache, tmp_path, monkeypatch):
    out, info = pair
    monkeypatch.setattr(build_mod, "train_lm", _no_training)  # base is cached, drift 0 trains nothing
    zero = build_pair("micro", tmp_path / "zero", drift=0.0, cache_dir=cache)
    assert zero["base_key"] == info["base_key"] and zero["key"] != info["key"]
    assert zero["base"]["cached"] and not zero["tuned"]["cached"]
    assert zero["base"]["fingerprint"] == info["base"]["fingerprint"]
    figs = zero["drift_figures"]["all"]
    assert all(c == pytest.approx(1.0, abs=1e-9) for c in figs["cka"])
    assert figs["kl"] == pytest.approx(0.0, abs=1e-12)
    base = load_file(str(tmp_path / "zero" / "base" / "model.safetensors"))
    tuned = load_file(str(tmp_path / "zero" / "tuned" / "model.safetensors"))
    assert base.keys() == tuned.keys() and all(torch.equal(base[k], tuned[k]) for k in base)


def test_cpu_build_is_deterministic(pair, tmp_path):
    _, info = pair
    again = build_pair("micro", tmp_path / "again", drift=1.0, cache_dir=tmp_path / "cache", force=True)
    assert again["base"]["fingerprint"] == info["base"]["fingerprint"]
    assert again["tuned"]["fingerprint"] == info["tuned"]["fingerprint"]
    assert again["drift_figures"] == info["drift_figures"]


def test_killed_build_leaves_nothing(pair, cache, tmp_path, monkeypatch):
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    def entries(cache_dir):  # what a build leaves: the entries' empty lock files (locks.building) do not count
        return sorted(p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock"))

    monkeypatch.setattr(build_mod, "train_lm", killed)
    before = entries(cache)
    with pytest.raises(KeyboardInterrupt):  # killed while fine-tuning (base is cached)
        build_pair("micro", tmp_path / "out", drift=0.5, cache_dir=cache)
    assert entries(cache) == before
    fresh = tmp_path / "fresh-cache"
    with pytest.raises(KeyboardInterrupt):  # killed while training base
        build_pair("micro", tmp_path / "out", cache_dir=fresh)
    assert entries(fresh) == []
    assert not (tmp_path / "out").exists()


def test_refuses_to_replace_a_foreign_directory(tmp_path, cache):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(LabError, match="not a target-pair directory"):
        build_pair("micro", tmp_path, cache_dir=cache)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_bad_drift_is_an_error(tmp_path, cache):
    with pytest.raises(LabError, match="drift must be >= 0"):
        build_pair("micro", tmp_path / "x", drift=-0.5, cache_dir=cache)


def test_cli_builds_and_prints_drift(pair, cache, capsys, monkeypatch):
    out, info = pair
    monkeypatch.setattr(build_mod, "train_lm", _no_training)
    argv = [
        "targets",
        "build",
        "--preset",
        "micro",
        "--out",
        str(out),
        "--drift",
        "1",
        "--cache-dir",
        str(cache),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "KL(base||tuned)" in printed and "CKA" in printed and info["tuned"]["fingerprint"] in printed


def test_cli_unknown_preset_exits_2_with_one_line(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "drafter_lab",
            "targets",
            "build",
            "--preset",
            "huge",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown preset 'huge'" in lines[0]
    assert all(name in lines[0] for name in PRESETS)
    assert not (tmp_path / "o").exists()


def test_cli_help_lists_every_config_field(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["targets", "build", "--help"])
    assert stop.value.code == 0
    printed = capsys.readouterr().out
    assert "--drift" in printed and all(
        f"--{f.name.replace('_', '-')}" in printed for f in dataclasses.fields(PRESETS["micro"])
    )


def test_a_base_another_run_is_building_is_waited_for(pair, cache, tmp_path, monkeypatch):
    """Studies at other drifts share the base: one started beside another waits for its build under the
    entry's lock, then finds it cached (both trained it before)."""
    import threading

    from drafter_lab import locks

    _, info = pair
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from drafter_lab.locks import building\n"
         "with building(Path(sys.argv[1]), 'x'):\n    print('held', flush=True); sys.stdin.readline()",
         str(cache / f"base-{info['base_key']}")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    waiting, built = threading.Event(), []
    monkeypatch.setattr(locks, "log", lambda line: waiting.set())
    monkeypatch.setattr(build_mod, "train_lm", _no_training)  # drift 0 trains nothing once the base is there
    thread = threading.Thread(target=lambda: built.append(build_pair("micro", tmp_path / "z", drift=0.0,
                                                                     cache_dir=cache)))
    thread.start()
    assert waiting.wait(60) and not built
    holder.communicate("done\n")
    thread.join(120)
    assert built and built[0]["base"]["cached"] and built[0]["base_key"] == info["base_key"]
