"""Outputs refused before the work (review s62, part 2): an existing file inside a directory the run reads
(a train run's best.json, a drafter's config.json), and a --plot that names no .png file."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main


def _refused(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
    return captured.err.strip()


@pytest.mark.parametrize("name", ["best.json", "metrics.jsonl", "best/config.json"])
def test_costmodel_refuses_a_json_over_a_file_of_its_input_run(tmp_path, capsys, name):
    """`costmodel --inputs RUN --json RUN/best.json` replaced the run's best record with the model."""
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    out = run / name
    out.write_text("{}\n")
    assert main(["costmodel", "--inputs", str(run), "--json", str(out)]) == 2
    assert _refused(capsys) == f"error: {out}: --json would replace this file, which --inputs {run} reads"
    assert out.read_text() == "{}\n"


def test_costmodel_refuses_a_json_over_a_file_of_its_input_run_through_a_link(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.json").write_text("{}")
    (tmp_path / "link").symlink_to(run)
    assert main(["costmodel", "--inputs", str(tmp_path / "link"), "--json", str(run / "best.json")]) == 2
    assert "--json would replace this file, which --inputs" in _refused(capsys)


def test_costmodel_writes_a_new_file_inside_its_input_run(tmp_path, capsys):
    """A file the run does not hold yet replaces nothing: the check lets it through (to the run's reading)."""
    run = tmp_path / "run"
    run.mkdir()
    assert main(["costmodel", "--inputs", str(run), "--json", str(run / "cost.json")]) == 2
    assert "would replace" not in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "name"), [("--drafter", "config.json"), ("--target", "tokenizer.json")])
def test_eval_refuses_a_json_over_a_file_of_its_drafter_or_target(tmp_path, capsys, flag, name):
    """`eval --drafter DIR --json DIR/config.json` replaced the drafter's config after the decoding."""
    given = tmp_path / "dir"
    given.mkdir()
    out = given / name
    out.write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"conversations": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "a"}]}) + "\n")
    models = ["--drafter", str(given), "--target", str(tmp_path / "missing")] if flag == "--drafter" else \
        ["--ngram", "--target", str(given)]
    assert main(["eval", *models, "--prompts", str(prompts), "--json", str(out)]) == 2
    assert _refused(capsys) == f"error: {out}: --json would replace this file, which {flag} {given} reads"
    assert out.read_text() == "{}"


@pytest.mark.parametrize("name", ["out.txt", "out.pdf", "out"])
def test_costmodel_refuses_a_plot_that_is_no_png(tmp_path, capsys, name):
    """`--plot out.txt` wrote PNG bytes into a .txt file (after the report and the JSON)."""
    out, js = tmp_path / name, tmp_path / "model.json"
    assert main(["costmodel", "--json", str(js), "--plot", str(out)]) == 2
    assert _refused(capsys) == f"error: {out}: --plot writes a PNG: name a .png file"
    assert not out.exists() and not js.exists()


def test_costmodel_plot_takes_an_upper_case_png(tmp_path, capsys):
    out = tmp_path / "model.PNG"
    assert main(["costmodel", "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_eval_refuses_a_plot_that_is_no_png(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"conversations": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "a"}]}) + "\n")
    out = tmp_path / "out.txt"
    assert main(["eval", "--ngram", "--target", str(tmp_path / "missing"), "--prompts", str(prompts),
                 "--plot", str(out)]) == 2
    assert _refused(capsys) == f"error: {out}: --plot writes a PNG: name a .png file"  # before the target loads


def test_an_output_written_again_inside_an_input_directory_is_allowed(tmp_path):
    """Only the files the lab reads there are refused: an earlier result of the same command is not one."""
    from drafter_lab.atomic import refuse_outputs
    from drafter_lab.errors import LabError

    run = tmp_path / "run"
    run.mkdir()
    (run / "cost.json").write_text("{}")
    (run / "best.json").write_text("{}")
    refuse_outputs([("--json", run / "cost.json")], [("--inputs", run)])
    with pytest.raises(LabError, match="would replace this file"):
        refuse_outputs([("--json", run / "best.json")], [("--inputs", run)])
