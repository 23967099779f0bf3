"""The whole study on the `smoke` config (micro pair): every file the issue lists, and a second run
that rebuilds nothing."""

import dataclasses
import json
import math

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments.config import get_config
from drafter_lab.experiments.study import run_study


@pytest.mark.slow
def test_smoke_study_writes_everything_then_reuses_its_cache(tmp_path):
    cfg = dataclasses.replace(get_config("smoke"), served_eval=False, ttt_steps=3)
    cache = tmp_path / "cache"
    with pytest.raises(LabError, match="arms must include a and b"):  # before anything is built
        run_study(dataclasses.replace(cfg, arms=["a", "c"]), tmp_path / "runs", cache)
    assert not cache.exists() and not (tmp_path / "runs").exists()
    run = run_study(cfg, tmp_path / "runs", cache, command=["test"])
    for name in ("report.md", "curves.png", "cond_acc_k.png", "manifest.json", "results.json", "probe.json",
                 "metrics-a.jsonl", "metrics-b.jsonl", "metrics-c.jsonl"):
        assert (run / name).stat().st_size > 0, name
    report = (run / "report.md").read_text()
    assert "(c) starts at loss_0" in report and f"ln {cfg.draft_vocab_size} = {math.log(cfg.draft_vocab_size):.2f}" in report
    assert "**Probe verdict:" in report and "**Measured outcome:" in report
    assert "The watch (`train --stop-if-behind` (a), default settings) would" in report
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["name"] == "smoke" and manifest["seeds"] == {"seed": cfg.seed}
    data = manifest["data"]["drift-1"]
    assert len(data["pair"]["corpus_sha256"]) == 64 and len(data["features"]["tuned"]["shards_sha256"]) == 64
    for key in "abc":
        rows = [json.loads(line) for line in (run / f"metrics-{key}.jsonl").read_text().splitlines()]
        val = [r for r in rows if r["split"] == "val"]
        assert val[0]["step"] == 0 and val[-1]["step"] == cfg.arm_steps

    cached = {p: p.stat().st_mtime_ns for sub in ("targets", "features", "source-drafters")
              for p in (cache / sub).rglob("*") if p.is_file()}
    again = run_study(cfg, tmp_path / "runs", cache, run_dir=tmp_path / "runs" / "second", command=["test"])
    assert {p: p.stat().st_mtime_ns for p in cached} == cached  # nothing rebuilt or rewritten
    first, second = (json.loads((d / "results.json").read_text()) for d in (run, again))
    level = first["levels"][0]  # the probe's drafters are measured at the arms' K
    assert {k for k in level["probe"]["zero_shot"] if k.startswith("cond_acc_")} == \
        {k for k in level["arms"][0]["final"] if k.startswith("cond_acc_")} == {"cond_acc_0", "cond_acc_1", "cond_acc_2"}
    assert [a["final"] for a in first["levels"][0]["arms"]] == [a["final"] for a in second["levels"][0]["arms"]]
