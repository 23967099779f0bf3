"""costmodel: one cost model prices one drafter; probe never writes over its recipe."""
import json

from drafter_lab import cli


def test_costmodel_refuses_two_drafters_measurements(tmp_path, capsys):
    """Two eval JSONs (or a run and an eval) were folded into one deployment: the later accept lengths beside
    the earlier n-gram lookup time and no-match share, a price neither drafter has (2.72x where each file
    alone said 1.26x and 0.89x)."""
    ev = tmp_path / "ev.json"
    ev.write_text(json.dumps({"served_accept_len": 3.2, "accept_histogram": {"1": 2, "5": 3},
                              "config": {"steps": 4, "topk": 1, "draft_tokens": 4, "batch": 1}}))
    ng = tmp_path / "ng.json"
    ng.write_text(json.dumps({"served_accept_len": 1.05, "accept_histogram": {"1": 19, "2": 1}, "draft_step_us": 5.0,
                              "no_draft_share": 0.9, "config": {"steps": 4, "topk": 1, "draft_tokens": 4, "batch": 1}}))
    assert cli.main(["costmodel", "--inputs", str(ev), "--inputs", str(ng)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(ev) in err and str(ng) in err


def test_probe_json_naming_its_pilot_config_is_refused_before_any_work(tmp_path, capsys):
    """probe --json F --pilot-config F would have replaced the recipe with the probe's result."""
    recipe = tmp_path / "pilot.toml"
    recipe.write_text("lr = 1e-3\n")
    missing = tmp_path / "nothing-here"  # never read: the outputs are checked first
    assert cli.main(["probe", "--drafter", str(missing), "--target", str(missing), "--data", str(missing),
                     "--pilot-config", str(recipe), "--json", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--json and --pilot-config name the same file") and str(recipe) in err
    assert recipe.read_text() == "lr = 1e-3\n"
