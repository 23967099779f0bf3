"""`data prepare` killed at any point resumes to the bytes of an uninterrupted run; a shard that is not
what its manifest row says, or not laid out as a shard, is one line naming it when read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from data_helpers import PREPARE_ARGS, run_cli, write_jsonl
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from drafter_lab import atomic
from drafter_lab.data import capture
from drafter_lab.data.capture_config import STOP_IDS, TEMPLATE_HASH, TOKENIZER_HASH, CaptureConfig
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import FeatureSet, Manifest, ShardReader, ShardWriter, stored_text
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import Target, load_target

# A `data prepare` SIGKILLed on the n-th call of one of its steps, as a user's kill -9 or an OOM kill.
KILLED = """
import os, signal, sys
from drafter_lab import cli
from drafter_lab.data import shards

owner, name, n = {"save": shards.Manifest, "put": shards.ShardWriter}[sys.argv[1]], sys.argv[1], int(sys.argv[2])
real, calls = getattr(owner, name), []

def hook(*args):
    calls.append(1)
    if len(calls) == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args)

setattr(owner, name, hook)
sys.exit(cli.main(sys.argv[3:]))
"""


def snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(("step", "n"), [("save", 1), ("put", 6)])
def test_a_run_killed_anywhere_resumes_to_the_same_bytes(features, random_llama, conversations_file, tmp_path,
                                                          step, n):
    """("save", 1): killed once its first shard landed, before its first manifest (while it hashes a
    shard of many GB, say): the directory holds a shard and no manifest, which the rerun took for
    another program's files and refused. ("put", 6): killed inside its second shard."""
    out = tmp_path / "feat"
    args = ["data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
            *PREPARE_ARGS]
    proc = subprocess.run([sys.executable, "-c", KILLED, step, str(n), *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == -9, proc.stderr
    assert run_cli(*args) == 0
    assert snapshot(out) == snapshot(features)


def test_a_resume_killed_once_a_recomputed_shard_landed_lists_it_as_it_is_now(features, random_llama,
                                                                              conversations_file, tmp_path,
                                                                              monkeypatch):
    """A resume that computes a listed shard again (its loss masks encode otherwise now) and is killed
    between that shard landing and the next manifest: the next resume kept the shard's old row (its
    old sha256 and loss_tokens) beside the new file."""
    from drafter_lab.data import capture

    out = tmp_path / "feat"
    shutil.copytree(features, out)
    moved = stored_text(out / "train-00001.safetensors")[0][-1]
    real = capture.encodings

    def fixed(seqs, *args):  # the new version: the last loss token of one answer no longer trains
        for conv, e in zip(seqs, real(seqs, *args)):
            yield e._replace(mask=e.mask & (torch.arange(len(e.mask)) < e.mask.nonzero().max())) \
                if conv.id == moved else e

    monkeypatch.setattr(capture, "encodings", fixed)
    landed = ShardWriter.__exit__

    def killed_once_landed(self, *exc):
        landed(self, *exc)
        raise KeyboardInterrupt

    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
            *PREPARE_ARGS)
    monkeypatch.setattr(ShardWriter, "__exit__", killed_once_landed)
    assert run_cli(*args) == 130
    monkeypatch.setattr(ShardWriter, "__exit__", landed)
    assert run_cli(*args) == 0
    rows = Manifest.load(out).shards["train"]
    for row in rows:
        _, _, mask, _ = stored_text(out / row["file"])
        assert (row["sha256"], row["loss_tokens"]) == (atomic.sha256_file(out / row["file"]), int(mask.sum()))
    assert rows[1]["loss_tokens"] == json.loads((features / "manifest.json").read_text())["shards"]["train"][1][
        "loss_tokens"] - 1


def _rewritten(shard, edit):
    tensors = load_file(shard)
    meta = safe_open(str(shard), "pt").metadata()
    tensors, meta = edit(tensors, meta)
    shard.unlink()
    save_file(tensors, str(shard), metadata=meta)


@pytest.mark.parametrize(("case", "message"), [
    ("another capture's shard", "holds 4 sequences of 792 tokens; the manifest lists 4 of 688"),
    ("offsets not from 0", "its offsets do not run up from 0"),
    ("offsets going back", "its offsets do not run up from 0"),
    ("input_ids cut short", "input_ids is [685]; its offsets and the manifest's hidden size say [688]"),
    ("seq_ids not a list", "its seq_ids are not a list"),
])
def test_a_shard_not_as_its_manifest_row_says_is_one_line(features, tmp_path, case, message):
    """Read silently before: another capture's shard copied in its place gave other sequences, and
    offsets or token tensors that disagree gave wrong slices (or a traceback deep in training)."""
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    shard = out / "train-00001.safetensors"
    if case == "another capture's shard":
        shutil.copy(out / "train-00000.safetensors", shard)
    elif case == "offsets not from 0":
        _rewritten(shard, lambda t, m: ({**t, "offsets": torch.cat([t["offsets"][:1] + 5, t["offsets"][1:]])}, m))
    elif case == "offsets going back":
        _rewritten(shard, lambda t, m: ({**t, "offsets": t["offsets"][[0, 2, 1, 3, 4]]}, m))
    elif case == "input_ids cut short":
        _rewritten(shard, lambda t, m: ({**t, "input_ids": t["input_ids"][:-3]}, m))
    else:
        _rewritten(shard, lambda t, m: (t, {"seq_ids": "{}"}))
    with pytest.raises(LabError) as e:
        FeatureSet(out).index("train")
    assert str(e.value).startswith(f"{shard}: ") and str(e.value).endswith(message)


@pytest.mark.parametrize("case", ["no aux_hidden", "final_hidden not rows"])
def test_scanning_a_shard_without_its_states_is_one_line(features, tmp_path, case):
    """`train` scans every listed shard (of both splits, with --val-data too): a traceback before."""
    shard = tmp_path / "train-00000.safetensors"
    shutil.copy(features / shard.name, shard)
    if case == "no aux_hidden":
        _rewritten(shard, lambda t, m: ({k: v for k, v in t.items() if k != "aux_hidden"}, m))
    else:
        _rewritten(shard, lambda t, m: ({**t, "final_hidden": t["final_hidden"].reshape(-1)}, m))
    with pytest.raises(LabError, match="truncated or corrupt feature shard") as e:
        ShardReader().scan(shard)
    assert str(e.value).startswith(f"{shard}: ")


def test_vocab_build_counts_no_shard_other_than_its_manifest_row_says(features, tmp_path):
    """`vocab build` read each shard's first `tokens` ids without the row checks: another capture's shard
    copied in counted other tokens, silently."""
    from drafter_lab.data.vocab import count_train_tokens

    out = tmp_path / "feat"
    shutil.copytree(features, out)
    shutil.copy(out / "train-00000.safetensors", out / "train-00001.safetensors")
    with pytest.raises(LabError, match="the manifest lists"):
        count_train_tokens(out)


# The device a capture ran on, empty ids, and the OpenAI API's `functions`.


def test_a_capture_begun_on_the_cpu_is_not_resumed_on_a_gpu(features, random_llama, conversations_file, tmp_path,
                                                             monkeypatch, capsys):
    """A GPU rounds otherwise: its states (and greedy answers) differ from the CPU's. The manifest's shards
    were resumed across devices, the two kinds mixed in one feature set."""
    out = tmp_path / "feat"
    shutil.copytree(features, out)
    args = ("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
            *PREPARE_ARGS)
    with monkeypatch.context() as m:
        m.setattr(Target, "device", property(lambda self: torch.device("cuda", 1)))
        capsys.readouterr()
        assert run_cli(*args) == 2
    assert "manifest was made with other settings (device: None there, 'cuda' now)" in capsys.readouterr().err
    assert snapshot(out) == snapshot(features)
    assert run_cli(*args) == 0  # on the CPU, as it was made


def test_the_regeneration_cache_is_named_by_a_gpu_and_as_before_on_the_cpu(random_llama, conversations_file,
                                                                           tmp_path, monkeypatch):
    """`--device cuda`, then `--device cpu`, on one --out reused the GPU's greedy answers. `cuda:1` is `cuda`."""
    target, convs = load_target(random_llama), read_conversations(conversations_file)[0]

    def cache_on(device: torch.device | None) -> tuple[str, dict]:
        with monkeypatch.context() as m:
            if device is not None:
                m.setattr(Target, "device", property(lambda self: device))
            source = capture._source(CaptureConfig(regenerate=True), conversations_file, convs, target)
        settings = capture.resume_settings(target.describe(), [2, 4, 5], "float32", source)
        return capture._regeneration(tmp_path, settings)[0].name, settings

    cpu, settings = cache_on(None)
    before = ("target fingerprint", "dtype", "sha256", "regenerate", TEMPLATE_HASH, "chat_template_kwargs",
              TOKENIZER_HASH, STOP_IDS)  # the keys that named it before the device counted
    assert "device" not in settings
    assert cpu == f"regenerated-{atomic.sha256_json({k: v for k, v in settings.items() if k in before})[:12]}.jsonl"
    gpu, settings = cache_on(torch.device("cuda", 1))
    assert settings["device"] == "cuda" and gpu != cpu and cache_on(torch.device("cuda"))[0] == gpu


def chat(cid, question: str, **row) -> dict:
    return {**({"id": cid} if cid is not None else {}),
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "ok"}], **row}


def test_an_empty_id_is_no_id(tmp_path):
    """`"id": ""` on every row kept the first conversation and dropped the rest as duplicates of it."""
    write = lambda name, ids: write_jsonl(tmp_path / name, [chat(i, q) for i, q in zip(ids, "abc")])  # noqa: E731
    convs, skipped = read_conversations(write("empty.jsonl", ["", "", " \t"]))
    unnamed, _ = read_conversations(write("none.jsonl", [None] * 3))
    assert skipped == {} and [c.id for c in convs] == [c.id for c in unnamed] and len({c.id for c in convs}) == 3


WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_openai_functions_read_as_tools(tmp_path):
    """The OpenAI API's request field before tools: ignored, so the template offered no tools."""
    path = write_jsonl(tmp_path / "c.jsonl", [chat(None, "a", functions=[WEATHER]),
                                              chat(None, "a", tools=[{"type": "function", "function": WEATHER}]),
                                              chat(None, "b", functions=json.dumps([WEATHER]))])
    (legacy, again), skipped = read_conversations(path)
    assert again.tools == legacy.tools == [{"type": "function", "function": WEATHER}]
    assert skipped == {"duplicate_id": 1}  # the same conversation as with tools, to its id
    for row, message in ((chat("x", "a", functions=[WEATHER], tools=[]), "both tools and functions"),
                         (chat("x", "a", functions={"name": "f"}), "functions must be a list of objects")):
        with pytest.raises(LabError) as e:
            read_conversations(write_jsonl(tmp_path / "bad.jsonl", [row]))
        assert str(e.value).startswith(f"{tmp_path / 'bad.jsonl'}: line 1: {message}")
