"""The day a chat template that reads the clock renders is one per run under torchrun too: each rank picked
its own from its own clock, so ranks reaching the pick on either side of midnight (or nodes in other time
zones) rendered other texts: an online run's rank 1 trained on tokens other than the ones rank 0 recorded,
and a tensor-parallel capture all-reduced the states of two texts. Rank 0's day now holds on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from data_helpers import make_conversations, write_jsonl
from test_review_s62_date import clock_llama  # noqa: F401  (the fixture)

SCRIPT = """
import datetime, json, sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers.utils import chat_template_utils

from drafter_lab.data import capture
from drafter_lab.data.capture_config import CaptureConfig

rank, store, model, convs, out, where = int(sys.argv[1]), *sys.argv[2:]
at = datetime.datetime(2026, 12, 5, 23, 59, 59) + datetime.timedelta(seconds=2 * rank)  # rank 1: after midnight


class Clock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return at


chat_template_utils.datetime = Clock
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
try:
    if where == "online":
        from drafter_lab.train.sources import Online, encoded_sha256

        src = Online(Path(model), Path(convs), CaptureConfig(max_length=64, val_fraction=0.25), torch.device("cpu"),
                     rank=rank, world=2)
        print(json.dumps([src.capture.chat_template_kwargs, encoded_sha256(src.items["train"])]))
    else:
        class Stop(Exception):
            pass

        def source(cfg, *args):  # the capture's first use of its settings, after the pick
            print(json.dumps([cfg.chat_template_kwargs]))
            raise Stop

        capture._source = source
        try:
            capture.prepare_features(model, convs, f"{out}-{rank}", max_length=64)
        except Stop:
            pass
finally:
    dist.destroy_process_group()
"""


def _two_ranks(tmp_path: Path, model: Path, where: str) -> list[list]:
    script, convs = tmp_path / "rank.py", tmp_path / "convs.jsonl"
    script.write_text(SCRIPT)
    write_jsonl(convs, make_conversations(8))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "store"), str(model), str(convs),
                               str(tmp_path / "out"), where], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    try:
        done = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in done]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in done]


def test_online_ranks_render_rank0s_day(clock_llama, tmp_path):  # noqa: F811
    rank0, rank1 = _two_ranks(tmp_path, clock_llama, "online")
    assert rank0[0] == {"template_date": "2026-12-05"}
    assert rank1 == rank0  # the same day, so the same tokens


def test_capture_ranks_render_rank0s_day(clock_llama, tmp_path):  # noqa: F811
    assert _two_ranks(tmp_path, clock_llama, "capture") == [[{"template_date": "2026-12-05"}]] * 2
