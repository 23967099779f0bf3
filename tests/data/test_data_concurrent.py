"""Two `data prepare` processes on one --out: the second waits for the first, then resumes its
finished directory, instead of deleting the first's half-written shard as stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from data_helpers import PREPARE_ARGS

# The first run, held inside its first shard until the test lets it go.
HELD = """
import sys, time
from pathlib import Path
from drafter_lab import cli
from drafter_lab.data import shards

flag = Path(sys.argv[1])
put = shards.ShardWriter.put

def held(self, j, seq):
    if not flag.with_suffix(".go").exists():
        flag.touch()
        while not flag.with_suffix(".go").exists():
            time.sleep(0.05)
    put(self, j, seq)

shards.ShardWriter.put = held
sys.exit(cli.main(sys.argv[2:]))
"""


def _start(*argv) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_second_run_on_the_same_out_waits_for_the_first(random_llama, conversations_file, tmp_path):
    out, flag = tmp_path / "feat", tmp_path / "held"
    args = ["data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
            *PREPARE_ARGS]
    first = _start("-c", HELD, flag, *args)
    while not flag.exists():  # until it is inside its first shard, whose temp file lies in `out`
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = _start("-m", "drafter_lab", *args)
    err2 = ""
    while "waiting for another run" not in err2 and second.poll() is None:
        err2 += second.stderr.readline()
    flag.with_suffix(".go").touch()
    out1, err1 = first.communicate()
    out2, rest = second.communicate()
    assert first.returncode == 0, err1
    assert second.returncode == 0, err2 + rest
    assert f"waiting for another run that is building the feature directory ({out})" in err2
    assert "0 to compute" in rest
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", *(r["file"] for rows in manifest["shards"].values() for r in rows)])

