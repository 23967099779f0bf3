"""`reproduce`: a real study re-run from its manifest (empty cache) matches; a changed metric or data
record is named; an unfinished run is refused."""

import json
from pathlib import Path

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.experiments.config import ExperimentConfig
from drafter_lab.experiments.reproduce import compare, flat_metrics, machine_note, package_note, reproduce
from drafter_lab.experiments.study import run_study
from drafter_lab.targets.hf import resolve_device

# The micro target pair and a few steps of everything: the whole pipeline, in seconds.
TINY = ExperimentConfig(
    name="tiny-test", target_preset="micro", max_length=128, max_new_tokens=16, draft_vocab_size=128,
    source_steps=4, arm_steps=3, eval_every=3, batch_size=2, served_prompts=1, served_steps=2,
)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_reproduce_from_an_empty_cache_is_identical_and_names_what_differs(tmp_path, one_thread):
    runs = tmp_path / "runs"
    run_dir = run_study(TINY, runs, tmp_path / "cache", run_dir=runs / "orig")
    metrics = flat_metrics(json.loads((run_dir / "results.json").read_text()))
    assert "drift 1 / arm b / cond_acc_0" in metrics and "drift 1 / pair / tuned fingerprint" in metrics

    new_dir, diffs = reproduce(run_dir, runs, tmp_path / "fresh-cache")
    assert diffs == []
    assert new_dir == runs / "orig-repro" and (new_dir / "manifest.json").exists()
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (run_dir, new_dir)]
    assert manifests[0]["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert manifests[0]["device"]["type"] == resolve_device(TINY.device).type
    assert machine_note(*manifests) is None and package_note(*manifests) is None  # same machine, same packages
    # Everything was built again in the empty cache, under the same content keys.
    assert sorted(p.name for p in (tmp_path / "fresh-cache" / "features").iterdir()) == \
        sorted(p.name for p in (tmp_path / "cache" / "features").iterdir())

    # Change one metric and one data record of the original: exactly those are reported, and the
    # second reproduction trains in its own directory instead of resuming the first one's arms.
    results = json.loads((run_dir / "results.json").read_text())
    arm_a = results["levels"][0]["arms"][0]
    arm_a["final"]["cond_acc_0"] += 0.25
    (run_dir / "results.json").write_text(json.dumps(results))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["data"]["drift-1"]["counts"]["tuned"]["train"]["sequences"] += 1
    (run_dir / "manifest.json").write_text(json.dumps(manifest))

    second, diffs = reproduce(run_dir, runs, tmp_path / "fresh-cache")
    assert second == runs / "orig-repro2"
    assert {d[0] for d in diffs} == {"drift 1 / arm a / cond_acc_0", "data / drift-1 / counts / tuned / train / sequences"}
    got = dict((k, (a, b)) for k, a, b in diffs)
    assert got["drift 1 / arm a / cond_acc_0"][0] == got["drift 1 / arm a / cond_acc_0"][1] + 0.25


def test_unfinished_run_is_refused_and_nothing_is_written(tmp_path):
    run_dir = tmp_path / "half"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"config": {"name": "x"}}))
    with pytest.raises(LabError, match="results.json is missing"):
        reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert not (tmp_path / "runs").exists()


def test_compare_tolerance_types_and_missing_keys():
    a = {"x": 1.0, "y": 2.0, "verdict": "reuse as is", "only_a": 3.0}
    b = {"x": 1.0 + 1e-9, "y": 2.0, "verdict": "train from scratch"}
    assert {k for k, _, _ in compare(a, b)} == {"x", "verdict", "only_a"}
    assert {k for k, _, _ in compare(a, b, rel_tol=1e-6)} == {"verdict", "only_a"}
    nan = float("nan")  # undefined in both runs: the same result, not a difference
    assert [k for k, _, _ in compare({"z": nan, "w": nan}, {"z": nan, "w": 1.0})] == ["w"]


def test_runs_recorded_before_the_pilot_and_the_ngram_baseline_reproduce_without_them(tmp_path):
    from drafter_lab.experiments.reproduce import recorded_config

    old = recorded_config({"config": {"name": "smoke", "target_preset": "micro"}}, tmp_path)
    assert old.probe_pilot_steps == 0 and not old.ngram_baseline and old.target_preset == "micro"
    new = recorded_config({"config": {"name": "smoke", "probe_pilot_steps": 8, "ngram_baseline": True}}, tmp_path)
    assert new.probe_pilot_steps == 8 and new.ngram_baseline
    with pytest.raises(LabError, match="no config to re-run"):
        recorded_config({}, tmp_path)


def test_machine_note_names_both_cpus():
    here = {"cpu": {"model": "AMD EPYC", "torch_capability": "AVX512"}}
    there = {"cpu": {"model": "Intel Xeon", "torch_capability": "AVX2"}}
    assert machine_note(there, here).startswith("the original ran on AVX2 (Intel Xeon), this run on AVX512 (AMD EPYC)")
    assert machine_note(here, dict(here)) is None and machine_note({}, here) is None  # older manifests: no record


def test_machine_note_names_both_devices_first():
    cpu = {"cpu": {"model": "AMD EPYC", "torch_capability": "AVX512"}, "device": {"type": "cpu"}}
    gpu = {**cpu, "device": {"type": "cuda", "name": "NVIDIA H200", "cuda": "13.0"}}
    assert machine_note(gpu, cpu).startswith("the original ran on cuda (NVIDIA H200), this run on cpu: ")
    assert machine_note(cpu, dict(cpu)) is None
    assert machine_note({"cpu": cpu["cpu"]}, gpu) is None  # a manifest from before the device record


def test_device_state_records_what_auto_resolved_to(monkeypatch):
    from drafter_lab.experiments.manifest import device_state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_state("auto") == {"type": "cpu"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev: f"GPU {dev}")
    assert device_state("auto") == {"type": "cuda", "name": "GPU cuda", "cuda": torch.version.cuda}


def test_package_note_names_each_version_that_moved():
    there = {"packages": {"torch": "2.13.0+cpu", "transformers": "5.24.0", "numpy": "2.4.6", "sglang": "0.5"}}
    here = {"packages": {"torch": "2.13.0+cpu", "transformers": "5.25.0", "numpy": "2.4.7"}}
    note = package_note(there, here)
    assert note.startswith("package versions differ from the original's (numpy 2.4.6 -> 2.4.7, "
                           "transformers 5.24.0 -> 5.25.0)")
    assert package_note(here, dict(here)) is None and package_note({}, here) is None


@pytest.mark.parametrize("cache_holds, noted", [(False, False), (True, True)])
def test_identical_says_when_the_cache_supplied_stages(tmp_path, monkeypatch, capsys, cache_holds, noted):
    """With the original run's cache (the default), the pair, features and source drafter are looked up,
    not rebuilt: "identical" then covers only what ran again, and says so."""
    from drafter_lab.cli import main
    from drafter_lab.experiments import reproduce as reproduce_mod

    orig, new, cache = tmp_path / "orig", tmp_path / "orig-repro", tmp_path / "cache"
    for d in (orig, new):
        d.mkdir()
        (d / "manifest.json").write_text("{}")
    cache.mkdir()
    if cache_holds:
        (cache / "pairs").mkdir()
    monkeypatch.setattr(reproduce_mod, "reproduce", lambda *a, **k: (new, []))
    assert main(["reproduce", str(orig), "--runs", str(tmp_path), "--cache", str(cache)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "identical" in out and ("were reused, not rebuilt" in out) == noted


def _recorded_run(tmp_path, manifest, results) -> Path:
    run_dir = tmp_path / "orig"
    run_dir.mkdir()
    for name, value in (("manifest.json", manifest), ("results.json", results)):
        (run_dir / name).write_text(value if isinstance(value, str) else json.dumps(value))
    return run_dir


RESULTS = {"levels": [{"drift_knob": 1.0, "arms": [{"key": "a", "final": {"cond_acc_0": 0.5}}],
                       "probe": {"zero_shot": {"cond_acc_0": 0.1}, "verdict": "train from scratch"}}]}


@pytest.mark.parametrize("manifest, results, file, message", [
    ("[1]", RESULTS, "manifest.json", "a JSON list, not an object: not a run's manifest"),
    ({"config": {"name": "smoke"}}, {}, "results.json", 'no "levels" list: not a study\'s results'),
    ({"config": {"name": "smoke"}}, {"levels": {}}, "results.json", 'no "levels" list: not a study\'s results'),
    ({"config": {"name": "smoke"}}, {"levels": [{"drift_knob": 1.0}]}, "results.json",
     "not a study's results (KeyError: 'arms')"),
    ({"config": {"name": "smoke", "arms": ["a"]}}, RESULTS, "manifest.json", "arms must include a and b"),
    ({"config": {"name": "smoke", "arm_steps": 0}}, RESULTS, "manifest.json", "arm_steps must be >= 1, got 0"),
    ({"config": {"name": "smoke", "arm_stepz": 3}}, RESULTS, "manifest.json", "config: unknown config key(s) arm_stepz"),
])
def test_a_run_that_cannot_be_reproduced_is_refused_naming_its_file_before_the_rerun(
        tmp_path, monkeypatch, manifest, results, file, message):
    from drafter_lab.experiments import reproduce as reproduce_mod

    monkeypatch.setattr(reproduce_mod, "run_study", lambda *a, **k: pytest.fail("the study re-ran"))
    run_dir = _recorded_run(tmp_path, manifest, results)
    with pytest.raises(LabError) as e:
        reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert str(e.value).startswith(f"{run_dir / file}: {message}")


@pytest.mark.parametrize("config, message", [
    ({"device": "cuda"}, "device 'cuda': no CUDA device is visible"),
    ({"threads": 100000}, "threads must be at most"),
])
def test_a_recording_this_machine_cannot_run_is_refused_before_the_rerun_dir(tmp_path, monkeypatch, config, message):
    from drafter_lab.experiments import reproduce as reproduce_mod

    monkeypatch.setattr(reproduce_mod, "run_study", lambda *a, **k: pytest.fail("the study re-ran"))
    run_dir = _recorded_run(tmp_path, {"config": {"name": "smoke", **config}}, RESULTS)
    with pytest.raises(LabError) as e:
        reproduce(run_dir, tmp_path / "runs", tmp_path / "cache")
    assert str(e.value).startswith(f"{run_dir / 'manifest.json'}: {message}")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("rel_tol", [-0.1, float("nan"), float("inf")])
def test_a_bad_relative_tolerance_is_refused_before_the_rerun(tmp_path, monkeypatch, capsys, rel_tol):
    from drafter_lab.cli import main
    from drafter_lab.experiments import reproduce as reproduce_mod

    monkeypatch.setattr(reproduce_mod, "run_study", lambda *a, **k: pytest.fail("the study re-ran"))
    run_dir = _recorded_run(tmp_path, {"config": {"name": "smoke"}}, RESULTS)
    argv = ["reproduce", str(run_dir), "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "cache"),
            "--rel-tol", str(rel_tol)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --rel-tol must be >= 0 and finite, got {rel_tol}\n"


def test_a_cache_that_is_a_file_is_refused_before_the_rerun(tmp_path, monkeypatch, capsys):
    from drafter_lab.cli import main
    from drafter_lab.experiments import reproduce as reproduce_mod

    monkeypatch.setattr(reproduce_mod, "run_study", lambda *a, **k: pytest.fail("the study re-ran"))
    run_dir = _recorded_run(tmp_path, {"config": {"name": "smoke"}}, RESULTS)
    (tmp_path / "cache").write_text("")
    assert main(["reproduce", str(run_dir), "--runs", str(tmp_path / "runs"), "--cache", str(tmp_path / "cache")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'cache'}: not a directory\n"


def test_reproduce_dot_inside_a_run_names_the_rerun_by_its_directory(tmp_path, monkeypatch):
    """`reproduce .` from inside the run: Path(".").name is "", which made the re-run `runs/-repro`."""
    from drafter_lab.experiments import reproduce as reproduce_mod

    run_dir = _recorded_run(tmp_path, {"config": {"name": "smoke"}}, RESULTS)
    taken = []

    def stop(cfg, runs_root, cache, run_dir, command):
        taken.append(run_dir)
        raise LabError("stopped before the re-run")
    monkeypatch.setattr(reproduce_mod, "run_study", stop)
    monkeypatch.chdir(run_dir)
    with pytest.raises(LabError, match="stopped before the re-run"):
        reproduce_mod.reproduce(".", tmp_path / "runs", tmp_path / "cache")
    assert taken == [tmp_path / "runs" / "orig-repro"]
