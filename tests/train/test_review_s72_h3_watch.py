"""Review of the watch (s72 h3): a run record whose held-out set is not an object, and a run directory
the watch cannot look into, are one line naming the file; a loss's gaps read as plain values."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.train.watch import WatchConfig, judge, read_run

ROWS = [{"split": "val", "step": s, "cond_acc_0": 0.5} for s in (100, 200, 300)]


def _run(path, record: dict):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (path / "run.json").write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("val", [None, 3, "x"])
def test_a_held_out_set_that_is_not_an_object_is_one_line(tmp_path, capsys, val):
    """Both runs' features.val alike (so not "different sets"): null or 3 was a TypeError's traceback from
    `"manifest_sha256" in val`, and "x" a substring test that passed silently."""
    record = {"config": {"batch_size": 4}, "features": {"sha256": "a", "val": val}}
    run, base = _run(tmp_path / "run", record), _run(tmp_path / "base", record)
    assert main(["watch", str(run), "--baseline", str(base)]) == 2
    assert capsys.readouterr().err == f"error: {run / 'run.json'}: not a run record: its features.val is not a JSON object\n"


def test_a_run_directory_the_watch_cannot_look_into_is_one_line(tmp_path):
    """exists() raises where it cannot look (here a name longer than the file system takes; another user's
    0700 directory does the same): train --stop-if-behind got that OSError's traceback."""
    with pytest.raises(LabError, match=r"/metrics\.jsonl: cannot be read \(File name too long\)$"):
        read_run(tmp_path / ("x" * 300))


def test_a_losss_gaps_read_as_plain_values_not_tokens():
    """Only an accept length is in tokens: a loss's gaps carry no unit."""
    base = [{"split": "val", "step": s, "loss_0": v} for s, v in ((100, 3.0), (200, 2.5), (300, 2.25))]
    run = [{"split": "val", "step": s, "loss_0": 3.5} for s in (100, 200, 300)]
    v = judge(run, base, WatchConfig(watch_metric="loss_0", watch_margin=0.05), 1000)
    assert v.stop and v.reason == ("loss_0 -1.25 against the baseline at step 300: behind at steps 100 / 200 / 300 "
                                   "(-0.5 / -1 / -1.25), not closing")


def test_the_watch_command_on_a_directory_it_cannot_look_into_is_one_line(tmp_path, capsys):
    """The command's own look for a run still starting up raised the OSError's traceback before read_run ran."""
    run = tmp_path / ("x" * 300)
    assert main(["watch", str(run), "--baseline", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {run / 'metrics.jsonl'}: cannot be read (File name too long)\n"
