"""Real processes SIGKILLed at chosen moments (inside a checkpoint's writes, right after one, between
metrics lines, in a validation, in a keep-best save, in the final save), then --resume: the drafter,
metrics.jsonl (elapsed_s aside), best/ and the directory's entries equal an uninterrupted run's.

One driver process imports the lab once and forks a child per attempt; a child arms one hook that
SIGKILLs itself at its moment, so each kill lands where it is named, not where a timer happens to."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drafter_lab.cli import main
from drafter_lab.data.shards import Manifest
from drafter_lab.train import state
from drafter_lab.train.metrics_log import read_metrics

DRIVER = r"""
import json, os, signal, sys, traceback
from pathlib import Path
import torch  # noqa: F401  (before the extension, as the lab imports it)
from drafter_lab import atomic
from drafter_lab.cli import main
from drafter_lab.train import loop, state
from drafter_lab.train.metrics_log import MetricsLog

def arm(kill):
    what, n = kill.split(":")
    seen = [0]
    def due():
        seen[0] += 1
        return seen[0] == int(n)
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    commit, exchange, save, write, evals = atomic._commit, atomic.exchange, loop.save_drafter, MetricsLog.write, loop.eval_counts
    def commit_(tmp, path):  # the temp is whole, not yet renamed
        if ((what == "state_written" and path.name == state.STATE_FILE)
                or (what == "weights_written" and path.name == "model.safetensors" and not path.parent.name.startswith(".best."))) and due():
            die()
        commit(tmp, path)
    def save_(drafter, where, *a, **k):
        out = save(drafter, where, *a, **k)
        if what == "best_written" and ".best." in Path(where).name and due():  # best's temp, before its swap
            die()
        return out
    def exchange_(a, b):
        out = exchange(a, b)
        if what == "best_swapped" and due():  # the old best/ still in the temp
            die()
        return out
    def write_(self, record):
        if what == "half_line" and due():
            with open(self.path, "ab") as f:
                f.write(json.dumps(record).encode()[:25])
            die()
        write(self, record)
        if what == "line" and due():
            die()
    def evals_(*a, **k):
        if what == "validating" and due():
            die()
        return evals(*a, **k)
    real_save = state.save
    def state_save(*a):
        real_save(*a)
        if what == "checkpointed" and due():
            die()
    atomic._commit, atomic.exchange, loop.save_drafter, MetricsLog.write, loop.eval_counts = (
        commit_, exchange_, save_, write_, evals_)
    state.save = state_save

from drafter_lab.targets.hf import load_target_head
import transformers
load_target_head(sys.argv[2])  # the imports every child needs, done once
transformers.AutoTokenizer, transformers.LlamaForCausalLM
codes = []
for argv, kill in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            if kill:
                arm(kill)
            code = main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    status = os.waitpid(pid, 0)[1]
    codes.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
print(json.dumps(codes))
"""

# 8 batches an epoch: states at steps 3, 6, 8 (epoch end), 9, 12, 15, 16 (epoch end) and 16 (final);
# validations at 3, 6, 8, 9, 12, 15 and 16; loss_0 improves at all of them but step 9.
COMMON = ["--draft-vocab-size", "128", "--epochs", "2", "--batch-size", "4", "--ttt-steps", "2", "--lr", "3e-3",
          "--warmup-steps", "3", "--eval-every", "3", "--log-every", "2", "--keep-best", "loss_0", "--threads", "1"]
ARGS = [*COMMON, "--checkpoint-every", "3"]
KILLS = {
    "during a checkpoint's state write": ["state_written:2"],
    "in the middle of a metrics line": ["half_line:9"],
    "during a checkpoint's drafter write": ["weights_written:4"],
    "between a metrics line and the next checkpoint": ["line:5"],
    "during a validation": ["validating:3"],
    "during a keep-best save": ["best_written:2"],
    "after keep-best's swap": ["best_swapped:3"],
    "during the final drafter write": ["weights_written:8"],
    "during the final state write": ["state_written:8"],
    "right after a checkpoint, then resumed and killed between two metrics lines": ["checkpointed:2", "line:3"],
}
# Online, in parts, a batch loaded ahead, ending mid-epoch: states at 4, 8 (its epoch's last batch done, not
# yet validated), 8 (epoch end) and 10 (final).
ONLINE_ARGS = [*COMMON, "--accumulation-steps", "2", "--prefetch", "true", "--max-steps", "10", "--checkpoint-every", "4"]
ONLINE_KILLS = {"online: during a validation": ["validating:2"],
                "online: right after its epoch's last step was checkpointed": ["checkpointed:2"]}


def _drive(jobs: list, target) -> list[int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs), str(target)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _train_argv(target, data: list, out: Path, args: list) -> list:
    return ["train", "--target", str(target), *data, "--out", str(out), *args]


@pytest.fixture(scope="module")
def runs(peaked_llama, features, tmp_path_factory) -> dict:
    """name -> (reference run, killed-and-resumed run), every attempt's exit code checked."""
    root = tmp_path_factory.mktemp("resume_review")
    source = Manifest.load(features).source
    online = ["--conversations", source["conversations"], "--val-fraction", str(source["val_fraction"]),
              "--max-length", str(source["max_length"])]
    jobs, expected, pairs = [], [], {}
    for data, args, kills, ref in ((["--data", str(features)], ARGS, KILLS, root / "full"),
                                   (online, ONLINE_ARGS, ONLINE_KILLS, root / "online_full")):
        jobs.append((_train_argv(peaked_llama, data, ref, args), None))
        expected.append(0)
        for i, (name, moments) in enumerate(kills.items()):
            out = root / f"{ref.name}_{i}"
            for j, moment in enumerate(moments):
                jobs.append((_train_argv(peaked_llama, data, out, args + ["--resume"] * (j > 0)), moment))
                expected.append(-signal.SIGKILL)
            jobs.append((_train_argv(peaked_llama, data, out, [*args, "--resume"]), None))
            expected.append(0)
            pairs[name] = (ref, out)
    assert _drive(jobs, peaked_llama) == expected  # every kill landed, every run and resume finished
    return pairs


def _rows(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(out)]


def _entries(out: Path) -> dict:
    """Every file under the run directory (temps included) -> its bytes, but for files that carry the time."""
    timed = {"metrics.jsonl", f"{state.STATE_DIR}/{state.STATE_FILE}"}
    return {str(p.relative_to(out)): (None if str(p.relative_to(out)) in timed else p.read_bytes())
            for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", [*KILLS, *ONLINE_KILLS])
def test_a_run_killed_then_resumed_equals_the_uninterrupted_one(runs, name):
    full, resumed = runs[name]
    a, b = _rows(full), _rows(resumed)
    assert [(r["event"], r["step"]) for r in b] == [(r["event"], r["step"]) for r in a]  # none twice, none missing
    assert b == a
    ea, eb = _entries(full), _entries(resumed)
    assert sorted(eb) == sorted(ea)  # no killed writer's temp left behind
    assert [k for k in ea if ea[k] != eb[k]] == []  # drafter, config, run.json and best/ byte for byte


def test_a_resume_with_other_settings_is_one_line_and_touches_nothing(runs, peaked_llama, features, capsys):
    _, out = runs["during a validation"]
    before = _entries(out), (out / "metrics.jsonl").read_bytes(), state.state_path(out).read_bytes()
    for change, field in ((["--lr", "1e-3"], "lr"), (["--eval-every", "4"], "eval_every"),
                          (["--batch-size", "2"], "batch_size")):
        code = main(_train_argv(peaked_llama, ["--data", str(features)], out, [*ARGS, *change, "--resume"]))
        err = capsys.readouterr().err.strip().splitlines()  # a progress line may come first
        assert code == 2 and err[-1].startswith("error: ") and "Traceback" not in "".join(err), err
        assert f"--resume with a different config ({field})" in err[-1]
    assert (_entries(out), (out / "metrics.jsonl").read_bytes(), state.state_path(out).read_bytes()) == before
