"""`eval` over several settings (a sweep) and the cost model's row per setting."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.cli import main
from drafter_lab.errors import LabError
from drafter_lab.spec import phaseplot
from drafter_lab.spec.costmodel import PRESETS, CostModel
from drafter_lab.spec.costreport import settings_table
from drafter_lab.spec.sweep import grid

SEEDS = "seeds-kimi-k2.5-8x-pcie"


def test_grid_keeps_what_can_be_drafted():
    rows = [(g["steps"], g["topk"], g["draft_tokens"]) for g in grid([2, 4], [1, 2], [8])]
    # a chain verifies its own S drafts; 2 steps x top-2 select at most 6 tokens, so (2, 2, 8) is left out
    assert rows == [(2, 1, 2), (4, 1, 4), (4, 2, 8)]
    assert [(g["topk"], g["draft_tokens"]) for g in grid([3], [1, 1, 2], None)] == [(1, 3), (2, 6)]
    with pytest.raises(LabError, match=r"a chain verifies the 4 tokens it drafts"):  # one setting: as a plain eval
        grid([4], [1], [8])
    with pytest.raises(LabError, match=r"draft_tokens must be in 1..6"):
        grid([2], [2], [7])
    with pytest.raises(LabError, match="no setting of the sweep can be drafted"):
        grid([2], [2], [7, 9])
    # batches vary fastest; each setting carries its batch
    assert [(g["steps"], g["batch"]) for g in grid([2, 4], [1], None, [1, 8])] == [(2, 1), (2, 8), (4, 1), (4, 8)]
    with pytest.raises(LabError, match="batch must be >= 1, got 4,0"):
        grid([2], [1], None, [4, 0])


@pytest.mark.parametrize("flag", ["--steps", "--topk", "--draft-tokens", "--batch", "--concurrency"])
def test_sweep_flags_take_positive_integers(flag, capsys):
    for bad, why in (("4,0", "expected positive integers"), ("4,x", "expected integers separated by commas")):
        with pytest.raises(SystemExit) as e:
            main(["eval", "--ngram", "--target", "t", "--prompts", "p.jsonl", flag, bad])
        assert e.value.code == 2 and f"argument {flag}: {why}" in capsys.readouterr().err


def test_cli_sweep_then_cost_model_rows(random_llama, drafter_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert main(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
                 "--steps", "2,4", "--topk", "1,2", "--draft-tokens", "6", "--max-new-tokens", "16",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fastest here:" in text and len([line for line in text.splitlines() if " | " in line]) == 5
    sweep = json.loads(out.read_text())["sweep"]
    assert [(r["config"]["steps"], r["config"]["topk"], r["config"]["draft_tokens"]) for r in sweep] == \
        [(2, 1, 2), (2, 2, 6), (4, 1, 4), (4, 2, 6)]
    assert all(r["lossless_check"] == "identical" and r["served_accept_len"] >= 1 for r in sweep)

    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--json", str(model)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(model.read_text())["settings"]
    assert len(rows) == 4
    for row, r in zip(rows, sweep):
        c = r["config"]
        m = CostModel(dataclasses.replace(PRESETS[SEEDS], steps=c["steps"], verify_tokens=c["draft_tokens"] + 1))
        assert row["spec_tok_s"] == pytest.approx(m.spec_tok_s(r["served_accept_len"]))
    best = max(rows, key=lambda row: row["spec_tok_s"])
    assert (f"--speculative-eagle-topk {best['topk']} --speculative-num-draft-tokens {best['draft_tokens'] + 1}"
            in text.splitlines()[-1])


def test_batch_sweep_prices_each_row_at_its_batch(random_llama, drafter_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert main(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
                 "--steps", "3", "--batch", "1,3", "--schedule", "continuous", "--max-new-tokens", "12",
                 "--json", str(out), "--plot", str(tmp_path / "phases.png")]) == 0
    text = capsys.readouterr().out
    assert "TPOT ratio" in text and "fastest here" not in text  # one drafting setting: nothing to choose
    sweep = json.loads(out.read_text())["sweep"]
    assert [(r["config"]["batch"], r["config"]["schedule"]) for r in sweep] == [(1, "continuous"), (3, "continuous")]
    assert all(r["lossless_check"] == "identical" for r in sweep)
    # The plot: a bar per row and decode, each the row's own phases per target pass.
    assert (tmp_path / "phases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bars = phaseplot.bars(sweep)
    assert [b["label"].rsplit(", ", 1)[1] for b in bars] == [
        "batch 1 continuous: speculative", "batch 1 continuous: target only",
        "batch 3 continuous: speculative", "batch 3 continuous: target only"]
    assert sum(bars[2]["ms"].values()) == pytest.approx(1e3 * sum(sweep[1]["phase_seconds"]["spec"].values())
                                                        / sweep[1]["verify_passes"])
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--verify-token-compute-us", "4", "--json", str(model)]) == 0
    assert "best at batch 3:" in capsys.readouterr().out
    rows = json.loads(model.read_text())["settings"]
    cfg = dataclasses.replace(PRESETS[SEEDS], steps=3, verify_token_compute_us=4.0)
    for row, r in zip(rows, sweep):
        m = CostModel(dataclasses.replace(cfg, batch=r["config"]["batch"]))
        assert row["batch"] == r["config"]["batch"]
        assert row["spec_tok_s"] == pytest.approx(m.spec_tok_s(r["served_accept_len"]))


def test_ngram_rows_are_priced_with_their_lookup_time_and_no_match_share():
    ngram = {"served_accept_len": 1.3, "draft_step_us": 20.0, "no_draft_share": 0.6,
             "config": {"steps": 4, "topk": 1, "draft_tokens": 4}}
    drafter = {"served_accept_len": 1.3, "config": {"steps": 4, "topk": 1, "draft_tokens": 4}}
    cfg = PRESETS[SEEDS]
    (n, d) = settings_table(cfg, [ngram, drafter])
    m = CostModel(dataclasses.replace(cfg, steps=4, verify_tokens=5))
    assert d["spec_tok_s"] == pytest.approx(m.spec_tok_s(1.3))
    assert n["cycle_ms"] == pytest.approx(m.verify_ms() + 4 * 0.020 + cfg.cycle_overhead_ms)
    assert n["spec_tok_s"] == pytest.approx(1300 / (0.4 * n["cycle_ms"] + 0.6 * cfg.decode_ms))
    # a measured latency table prices each row's own message: 4 and 9 verified tokens differ
    table = {8192: 10.0, 1 << 20: 100.0}
    wide = dict(drafter, config={"steps": 4, "topk": 2, "draft_tokens": 8})
    a, b = settings_table(cfg, [drafter, wide], table)
    assert a["allreduce_us"] < b["allreduce_us"]


def test_bad_sweep_file(tmp_path):
    from drafter_lab.spec.costinputs import read_inputs

    f = tmp_path / "sweep.json"
    f.write_text(json.dumps({"sweep": [{"served_accept_len": 2.0}]}))
    with pytest.raises(LabError, match="sweep must be a list of `eval --json` results"):
        read_inputs(f)
    # a served eval at a request rate is priced at the requests it carried: without them, one line (a KeyError)
    rated = {"served_accept_len": 2.0, "config": {"steps": 2, "request_rate": 1.0}}
    for content in ({"sweep": [rated]}, rated, dict(rated, in_flight={"spec": float("nan")})):
        f.write_text(json.dumps(content))
        with pytest.raises(LabError, match=f"^{f}: a served eval at a request rate needs in_flight.spec"):
            from drafter_lab.spec.costinputs import apply_inputs
            from drafter_lab.spec.costmodel import PRESETS

            apply_inputs(PRESETS["seeds-kimi-k2.5-8x-pcie"], f)


def evaluations(monkeypatch, dies_at: int) -> list:
    """The steps of each setting a sweep evaluates from now on; the `dies_at`-th is killed (Ctrl-C)."""
    from drafter_lab.spec import eval as spec_eval

    real, calls = spec_eval.evaluate, []

    def evaluate(*args, **kwargs):
        calls.append(kwargs["steps"])
        if len(calls) == dies_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(spec_eval, "evaluate", evaluate)
    return calls


def test_killed_sweep_resumes_where_it_stopped(random_llama, drafter_dir, prompts_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep.json"
    argv = ["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
            "--steps", "1,2,3", "--max-new-tokens", "12", "--json", str(out)]
    calls = evaluations(monkeypatch, dies_at=3)
    assert main(argv) == 130  # interrupted
    assert not out.exists() and (tmp_path / "sweep.json.partial").exists()
    calls.clear()
    assert main(argv) == 0
    assert calls == [3]  # steps 1 and 2 came from the journal
    assert "2 of 3 settings already decoded" in capsys.readouterr().err
    resumed = json.loads(out.read_text())["sweep"]
    assert not (tmp_path / "sweep.json.partial").exists()
    monkeypatch.undo()
    again = tmp_path / "again.json"
    assert main([*argv[:-1], str(again)]) == 0
    fresh = json.loads(again.read_text())["sweep"]
    for a, b in zip(resumed, fresh):
        assert (a["accept_histogram"], a["spec_tokens"]) == (b["accept_histogram"], b["spec_tokens"])
    # a journal made with other decoding settings is refused, not mixed in
    evaluations(monkeypatch, dies_at=3)
    assert main(argv) == 130
    capsys.readouterr()
    assert main([*argv[:-3], "8", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sweep.json.partial" in err and "other settings" in err and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("delete it or use another --json")  # eval has no --out


def _before_the_template_hash(settings, target, drafter):
    assert settings.pop("chat_template_sha256")


def _naming_models_the_older_way(settings, target, drafter):
    """Target and drafter by their files' heads and tails; nor did it record the device and threads."""
    from drafter_lab.targets.fingerprint import legacy_fingerprint

    settings.update(target=legacy_fingerprint(target), drafter=legacy_fingerprint(drafter))
    del settings["timed_on"]


@pytest.mark.parametrize("older, logged", [(_before_the_template_hash, "begun before the lab recorded chat templates"),
                                           (_naming_models_the_older_way, "")])
def test_a_sweep_journal_an_older_lab_began_resumes(random_llama, drafter_dir, prompts_file, tmp_path, monkeypatch,
                                                   capsys, older, logged):
    out, partial = tmp_path / "sweep.json", tmp_path / "sweep.json.partial"
    argv = ["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
            "--steps", "1,2", "--max-new-tokens", "8", "--json", str(out)]
    calls = evaluations(monkeypatch, dies_at=2)
    assert main(argv) == 130
    header, *rest = partial.read_text().split("\n")
    header = json.loads(header)
    older(header["settings"], random_llama, drafter_dir)  # what that lab wrote
    partial.write_text("\n".join([json.dumps(header), *rest]))
    calls.clear()
    capsys.readouterr()
    assert main(argv) == 0
    assert calls == [2] and logged in " ".join(capsys.readouterr().err.split())


def test_a_sweep_resumed_with_other_threads_is_refused(random_llama, drafter_dir, prompts_file, tmp_path, monkeypatch,
                                                      capsys):
    """Its rows' tok/s ratios compare within one machine setting: resumed with --threads 1 after --threads 2,
    a steps-2 row timed at 2 threads and a steps-4 row at 1 named the wrong setting fastest."""
    import torch

    out = tmp_path / "sweep.json"
    argv = ["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
            "--steps", "1,2", "--max-new-tokens", "8", "--json", str(out)]
    threads = torch.get_num_threads()
    try:
        evaluations(monkeypatch, dies_at=2)
        assert main([*argv, "--threads", "2"]) == 130
        capsys.readouterr()
        assert main([*argv, "--threads", "1"]) == 2
        err = capsys.readouterr().err
        assert "sweep.json.partial" in err and "other settings" in err
        calls = evaluations(monkeypatch, dies_at=0)
        assert main([*argv, "--threads", "2"]) == 0 and calls == [2]
    finally:
        torch.set_num_threads(threads)
