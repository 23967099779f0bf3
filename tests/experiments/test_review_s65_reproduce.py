"""`reproduce`: which results it compares (every deterministic one a study writes), how it compares them,
and what the whole command hands back, with the study's re-run faked so that each case takes milliseconds."""

from __future__ import annotations

import copy
import json
import math

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import reproduce as reproduce_mod
from drafter_lab.experiments.reproduce import ABSENT, code_note, compare, flat_metrics, package_note


def _served(accept: float) -> dict:
    return {"served_accept_len": accept, "verify_steps": 10, "spec_tokens": 30, "baseline_tokens": 30,
            "lossless_check": "identical", "accept_histogram": {"1": 4, "3": 6}, "tok_s": 123.4}


# One level with every part a study's results.json holds; timings, paths and speeds are not results.
RESULTS = {"levels": [{
    "drift_knob": 1.0,
    "pair": {"corpus": {"hash": "c0ffee", "path": "/cache/corpus"},
             "base": {"fingerprint": "fb"}, "tuned": {"fingerprint": "ft"},
             "drift_figures": {"all": {"kl": 0.25, "cka": [0.9, None]}}},
    "arms": [{"key": "a", "final": {"step": 3, "cond_acc_0": 0.5}, "served": _served(1.5)}],
    "source_served_zero_shot": _served(1.25),
    "ngram_served": _served(1.125),
    "ngram_across_served": _served(1.0625),
    "probe": {"zero_shot": {"cond_acc_0": 0.1}, "home": {"cond_acc_0": 0.4}, "aux_cka": [0.8],
              "pilot": {"curve": [{"step": 4, "scratch_cond_acc_0": 0.2}]}, "verdict": "train from scratch"},
    "measured_outcome": "transfer pays",
    "timings": {"arm_a_s": 1.0},
}]}


def _served_keys(prefix: str, accept: float) -> dict:
    return {f"{prefix} / served_accept_len": accept, f"{prefix} / verify_steps": 10, f"{prefix} / spec_tokens": 30,
            f"{prefix} / baseline_tokens": 30, f"{prefix} / lossless_check": "identical",
            f"{prefix} / accepted 1": 4, f"{prefix} / accepted 3": 6}


def test_flat_metrics_holds_every_deterministic_result_of_a_level():
    """A part left out is a part reproduce never compares: it would say "identical" whatever it held."""
    got = flat_metrics(RESULTS)
    cka_nan = got.pop("drift 1 / pair / drift all / cka 1")
    assert math.isnan(cka_nan)  # a null CKA is compared as the NaN it was
    assert got == {
        "drift 1 / pair / corpus hash": "c0ffee",
        "drift 1 / pair / base fingerprint": "fb",
        "drift 1 / pair / tuned fingerprint": "ft",
        "drift 1 / pair / drift all / kl": 0.25,
        "drift 1 / pair / drift all / cka 0": 0.9,
        "drift 1 / arm a / step": 3,
        "drift 1 / arm a / cond_acc_0": 0.5,
        **_served_keys("drift 1 / arm a / served", 1.5),
        **_served_keys("drift 1 / source drafter zero-shot / served", 1.25),
        **_served_keys("drift 1 / n-gram lookup / served", 1.125),
        **_served_keys("drift 1 / n-gram lookup across prompts / served", 1.0625),
        "drift 1 / probe zero-shot / cond_acc_0": 0.1,
        "drift 1 / probe home / cond_acc_0": 0.4,
        "drift 1 / probe / aux cka 0": 0.8,
        "drift 1 / probe / pilot step 4 / scratch_cond_acc_0": 0.2,
        "drift 1 / probe verdict": "train from scratch",
        "drift 1 / measured outcome": "transfer pays",
    }


@pytest.mark.parametrize("part, label", [("source_served_zero_shot", "source drafter zero-shot"),
                                         ("ngram_served", "n-gram lookup"),
                                         ("ngram_across_served", "n-gram lookup across prompts")])
def test_a_baseline_whose_acceptance_moved_is_a_difference(part, label):
    moved = copy.deepcopy(RESULTS)
    moved["levels"][0][part]["served_accept_len"] += 0.5
    assert [k for k, _, _ in compare(flat_metrics(RESULTS), flat_metrics(moved))] == \
        [f"drift 1 / {label} / served / served_accept_len"]


def test_a_metric_undefined_in_one_run_and_absent_in_the_other_is_a_difference():
    """NaN on both sides is the same result; NaN against a metric the other run never wrote is not."""
    [(key, x, y)] = compare({"x": math.nan}, {})
    assert key == "x" and math.isnan(x) and y is ABSENT
    assert [k for k, _, _ in compare({}, {"x": math.nan})] == ["x"]


def test_counts_stay_exact_and_floats_exact_without_a_tolerance():
    assert [k for k, _, _ in compare({"n": 1000}, {"n": 1001}, rel_tol=0.5)] == ["n"]  # two ints: a count
    assert [k for k, _, _ in compare({"x": 0.0}, {"x": 1e-13})] == ["x"]  # no tolerance: not even a tiny one


def test_code_note_names_a_rerun_from_a_tree_with_changes():
    clean, dirty = {"git": {"sha": "a" * 40, "dirty": False}}, {"git": {"sha": "a" * 40, "dirty": True}}
    assert code_note(clean, dirty).startswith(
        "the original ran the lab at aaaaaaaaaaaa, this run at aaaaaaaaaaaa with uncommitted changes:")
    # re-run from an installed copy outside a checkout, which records no commit: nothing to compare
    assert code_note(clean, {"git": {}}) is None and code_note(clean, {}) is None


def test_package_note_says_how_to_install_the_recorded_versions():
    note = package_note({"packages": {"torch": "2.12"}}, {"packages": {"torch": "2.13"}})
    assert note.startswith("package versions differ from the original's (torch 2.12 -> 2.13)")
    assert note.endswith("`nox -s reproduce` installs the versions the run recorded")


@pytest.fixture
def recorded(tmp_path):
    run_dir = tmp_path / "orig"
    run_dir.mkdir()
    manifest = {"config": {"name": "smoke"}, "data": {"drift-1": {"counts": {"sequences": 1000}, "key": "k1"}}}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / "results.json").write_text(json.dumps(RESULTS))
    return run_dir, manifest


def _rerun_writing(monkeypatch, manifest: dict, results: dict, calls: list):
    def rerun(cfg, runs_root, cache, run_dir, command):
        calls.append(command)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
        (run_dir / "results.json").write_text(json.dumps(results))
        return run_dir
    monkeypatch.setattr(reproduce_mod, "run_study", rerun)


def test_rel_tol_forgives_a_rounded_metric_but_no_data_record(tmp_path, monkeypatch, recorded):
    """--rel-tol is for metrics that round differently on another CPU; the data record (counts, keys)
    must match exactly: a feature set one sequence larger is rebuilt data, not rounding."""
    run_dir, manifest = recorded
    results = copy.deepcopy(RESULTS)
    results["levels"][0]["arms"][0]["final"]["cond_acc_0"] *= 1 + 1e-6
    again = copy.deepcopy(manifest)
    again["data"]["drift-1"]["counts"]["sequences"] += 1
    calls = []
    _rerun_writing(monkeypatch, again, results, calls)
    new_dir, diffs = reproduce_mod.reproduce(run_dir, tmp_path / "runs", tmp_path / "cache", rel_tol=1e-3)
    assert new_dir == tmp_path / "runs" / "orig-repro"
    assert diffs == [("data / drift-1 / counts / sequences", 1000.0, 1001.0)]
    assert calls == [["drafter-lab", "reproduce", str(run_dir)]]  # the re-run's manifest says what made it
    # without a tolerance the metric is named too, before the data
    _, diffs = reproduce_mod.reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert [k for k, _, _ in diffs] == ["drift 1 / arm a / cond_acc_0", "data / drift-1 / counts / sequences"]


def test_a_data_record_that_changed_is_named(tmp_path, monkeypatch, recorded):
    run_dir, manifest = recorded
    again = copy.deepcopy(manifest)
    again["data"]["drift-1"]["key"] = "k2"
    _rerun_writing(monkeypatch, again, RESULTS, [])
    _, diffs = reproduce_mod.reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert diffs == [("data / drift-1 / key", "k1", "k2")]


@pytest.mark.parametrize("level, error", [
    ({"drift_knob": 1.0, "arms": 3}, "TypeError"),  # a count where the arms' list belongs
    ({"drift_knob": 1.0, "pair": "micro", "arms": []}, "AttributeError"),  # a name where the pair's record belongs
])
def test_a_results_json_of_another_shape_is_one_line_naming_it(tmp_path, monkeypatch, level, error):
    run_dir = tmp_path / "orig"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"config": {"name": "smoke"}}))
    (run_dir / "results.json").write_text(json.dumps({"levels": [level]}))
    monkeypatch.setattr(reproduce_mod, "run_study", lambda *a, **k: pytest.fail("the study re-ran"))
    with pytest.raises(LabError) as e:
        reproduce_mod.reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert str(e.value).startswith(f"{run_dir / 'results.json'}: not a study's results ({error}: ")


@pytest.mark.parametrize("record", [{"packages": ["torch"]}, {"packages": 3}, {"device": "cuda"}, {"cpu": "AVX2"}])
def test_a_hand_edited_machine_record_gives_no_note_not_a_traceback_after_the_rerun(tmp_path, monkeypatch, capsys,
                                                                                     record):
    """The notes are read after the whole re-run: a record of another shape (which noxfile's
    recorded_versions already ignores) was a TypeError or AttributeError there, and the comparison was lost."""
    from drafter_lab.cli import main

    here = {"packages": {"torch": "2.13.0"}, "device": {"type": "cpu"}, "cpu": {"model": "x", "torch_capability": "AVX2"}}
    orig, new = tmp_path / "orig", tmp_path / "orig-repro"
    for d, manifest in ((orig, {**here, **record}), (new, here)):
        d.mkdir()
        (d / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(reproduce_mod, "reproduce", lambda *a, **k: (new, []))
    assert main(["reproduce", str(orig), "--runs", str(tmp_path), "--cache", str(tmp_path / "cache")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "identical" in out and "note:" not in out
    assert reproduce_mod.machine_note(*(json.loads((d / "manifest.json").read_text()) for d in (new, orig))) is None
    assert reproduce_mod.package_note(*(json.loads((d / "manifest.json").read_text()) for d in (new, orig))) is None
