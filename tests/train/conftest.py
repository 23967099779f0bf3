"""Features captured from the shared random Llama target, for the training tests."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    """Chats built from Python stdlib source: real text, real chat template, real loss mask."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join(f.read_text(errors="replace") for f in sorted(root.glob("*.py"))[seed:seed + 12])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    with open(path, "w") as f:
        for i in range(n):
            a = (i * 7) % (len(lines) - 12)
            convo = [
                {"role": "user", "content": "\n".join(lines[a:a + 2])},
                {"role": "assistant", "content": "\n".join(lines[a + 2:a + 8])},
            ]
            f.write(json.dumps({"id": f"c{i}", "conversations": convo}) + "\n")
    return path


@pytest.fixture(scope="session")
def peaked_llama(random_llama, tmp_path_factory) -> Path:
    """The shared random Llama with a 30x lm_head: its next-token distributions are peaked
    (entropy ~1.7 nats instead of ~6), so a drafter has something to learn in a few steps."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    out = tmp_path_factory.mktemp("peaked") / "model"
    model = LlamaForCausalLM.from_pretrained(random_llama)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(random_llama).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def features(peaked_llama, tmp_path_factory) -> Path:
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("features")
    convs = write_conversations(root / "convs.jsonl", 48)
    out = root / "features"
    prepare_features(peaked_llama, convs, out, max_length=96, val_fraction=0.25, batch_size=16)
    return out


@pytest.fixture(scope="session")
def held_out(peaked_llama, tmp_path_factory) -> tuple[Path, Path]:
    """Conversations apart from the `features` ones (other stdlib files), and their features."""
    from drafter_lab.data.capture import prepare_features

    root = tmp_path_factory.mktemp("held_out")
    convs = write_conversations(root / "held_out.jsonl", 12, seed=20)
    prepare_features(peaked_llama, convs, root / "features", max_length=96, val_fraction=0.25, batch_size=16)
    return convs, root / "features"


@pytest.fixture
def out_of_vocab_held_out(held_out, tmp_path) -> tuple[Path, Path]:
    """A copy of the held-out features whose first shard's sequences' second tokens are id 999999, past any
    test vocab: (its directory, that shard)."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    from drafter_lab.data.shards import Manifest

    bad = tmp_path / "val"
    shutil.copytree(held_out[1], bad)
    shard = bad / Manifest.load(bad).shards["train"][0]["file"]
    with safe_open(str(shard), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["input_ids"][t["offsets"][:-1] + 1] = 999999
    save_file(t, str(shard), metadata=meta)
    return bad, shard


@pytest.fixture
def trained(monkeypatch, tmp_path) -> list[dict]:
    """train() replaced by one that records what the command line handed it (step 5 reached), run in tmp_path."""
    calls = []

    def train(cfg, target, data, out, **kwargs):
        calls.append({"cfg": cfg, "target": target, "data": data, "out": out, **kwargs})
        return {"step": 5, "loss_0": 1.0}

    monkeypatch.setattr("drafter_lab.train.loop.train", train)
    monkeypatch.chdir(tmp_path)
    return calls


@pytest.fixture
def no_training(monkeypatch):
    """train() replaced by one that fails the test: the command line should have been refused first."""
    def train(*args, **kwargs):
        raise AssertionError("train ran: the command line should have been refused first")

    monkeypatch.setattr("drafter_lab.train.loop.train", train)
