"""Output paths checked before the work (review s62): an unwritable one, one that names an input or the
other output; a chat template variable that is no finite number; a regeneration's refusal naming its file."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from drafter_lab.cli import main

CONVERSATIONS = [{"id": f"c{i}", "conversations": [{"role": "user", "content": f"question {i}"},
                                                    {"role": "assistant", "content": f"answer {i}"}]}
                 for i in range(3)]


def _jsonl(path, rows=CONVERSATIONS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(capsys, *named) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
    assert all(n in captured.err for n in named), captured.err
    return captured.err


def test_costmodel_refuses_an_unwritable_plot_before_writing_its_json(tmp_path, capsys):
    """`costmodel --json OK --plot DIR` printed the report, wrote the JSON, then failed on the plot: exit 2 with
    half its output written."""
    (tmp_path / "dir").mkdir()
    out = tmp_path / "model.json"
    assert main(["costmodel", "--json", str(out), "--plot", str(tmp_path / "dir")]) == 2
    _refused(capsys, "--plot", str(tmp_path / "dir"))
    assert not out.exists()


def test_costmodel_refuses_a_json_that_is_a_directory_before_the_report(tmp_path, capsys):
    """`--json DIR` printed the whole report before its error."""
    assert main(["costmodel", "--json", str(tmp_path)]) == 2
    _refused(capsys, "--json", "is a directory")


def test_costmodel_refuses_a_json_that_is_its_input(tmp_path, capsys):
    """`costmodel --inputs sweep.json --json sweep.json` replaced the measured sweep with the model."""
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"allreduce_us": 12.0}))
    before = sweep.read_bytes()
    assert main(["costmodel", "--inputs", str(sweep), "--json", str(tmp_path / "." / "sweep.json")]) == 2
    assert _refused(capsys).strip() == f"error: {tmp_path / '.' / 'sweep.json'}: --json and --inputs name the same file"
    assert sweep.read_bytes() == before


def test_costmodel_refuses_a_plot_that_is_its_json(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert main(["costmodel", "--json", str(out), "--plot", str(out)]) == 2
    _refused(capsys, "--json and --plot name the same file")
    assert not out.exists()


def _eval(prompts, *outputs) -> int:
    return main(["eval", "--ngram", "--target", "/nonexistent/target", "--prompts", str(prompts), *map(str, outputs)])


@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_eval_refuses_a_json_that_is_its_prompts(tmp_path, capsys, link):
    """`eval --prompts p.jsonl --json p.jsonl` replaced the prompt set with the result: refused before the
    target loads, through a symbolic or hard link too."""
    prompts = _jsonl(tmp_path / "p.jsonl")
    before = prompts.read_bytes()
    out = {"same": prompts, "symlink": tmp_path / "s.jsonl", "hardlink": tmp_path / "h.jsonl"}[link]
    if link == "symlink":
        out.symlink_to(prompts)
    elif link == "hardlink":
        os.link(prompts, out)
    assert _eval(prompts, "--json", out) == 2
    assert _refused(capsys).strip() == f"error: {out}: --json and --prompts name the same file"
    assert prompts.read_bytes() == before


def test_eval_refuses_a_plot_that_is_its_json(tmp_path, capsys):
    """`eval --json X --plot X` left a PNG where the JSON was."""
    assert _eval(_jsonl(tmp_path / "p.jsonl"), "--json", tmp_path / "x", "--plot", tmp_path / "x") == 2
    _refused(capsys, "--json and --plot name the same file")


def test_eval_takes_outputs_beside_its_prompts(tmp_path, capsys):
    """Other paths pass the check: the run goes on to load the (missing) target."""
    assert _eval(_jsonl(tmp_path / "p.jsonl"), "--json", tmp_path / "p.json", "--plot", tmp_path / "p.png") == 2
    assert "name the same file" not in capsys.readouterr().err


def test_regenerate_refuses_an_out_that_is_a_hard_link_to_its_conversations(tmp_path, capsys):
    convs = _jsonl(tmp_path / "c.jsonl")
    os.link(convs, tmp_path / "out.jsonl")
    assert main(["data", "regenerate", "--conversations", str(convs), "--out", str(tmp_path / "out.jsonl"),
                 "--target", "/nonexistent/target"]) == 2
    _refused(capsys, "--out is the --conversations file")


def test_bench_draft_forward_refuses_a_markdown_that_is_its_json(tmp_path):
    from drafter_lab.errors import LabError
    from drafter_lab.kernels.bench_draft_forward import parse

    with pytest.raises(LabError, match="--json and --markdown name the same file"):
        parse(["--device", "cpu", "--json", str(tmp_path / "x"), "--markdown", str(tmp_path / "x")])


def test_same_file_survives_a_link_loop(tmp_path):
    from drafter_lab.atomic import same_file

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert same_file(tmp_path / "loop", tmp_path / "loop") and not same_file(tmp_path / "loop", tmp_path / "other")


@pytest.mark.parametrize("text", ['{"enable_thinking": NaN}', '{"a": [1, {"b": -Infinity}]}', '{"a": Infinity}',
                                  '{"a": 1e999}'])
def test_template_kwargs_refuse_a_number_json_has_not(text):
    """json.loads takes NaN and Infinity (and reads 1e999 as inf): the template saw NaN, the manifest recorded
    null, so a later run given null matched it."""
    from drafter_lab.data.capture_config import template_kwargs_arg

    with pytest.raises(argparse.ArgumentTypeError, match="finite numbers") as e:
        template_kwargs_arg(text)
    assert "\n" not in str(e.value)
    assert template_kwargs_arg('{"a": 1.5, "b": [100000000000000000000000]}') == {"a": 1.5, "b": [10 ** 23]}


def test_template_kwargs_nan_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", "regenerate", "--conversations", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "o.jsonl"),
              "--target", "t", "--chat-template-kwargs", '{"enable_thinking": NaN}'])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --chat-template-kwargs: NaN is not a JSON number" in err and "Traceback" not in err, err


ALTERNATE = ("{% for m in messages %}{% if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] %}"
             "{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}")
# Two answers in a row: two user turns in a row get an answer between them, which the template takes.
TWICE = {"id": "twice", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                          {"role": "assistant", "content": "again"}, {"role": "user", "content": "q2"},
                                          {"role": "assistant", "content": "a2"}]}


@pytest.fixture
def refusing_target(monkeypatch, random_llama):
    """The random Llama, loaded with a chat template that refuses two turns of one role in a row."""
    from drafter_lab.data import capture
    from drafter_lab.targets import hf

    original = hf.load_target

    def load(*args, **kwargs):
        target = original(*args, **kwargs)
        target.tokenizer.chat_template = ALTERNATE + target.tokenizer.chat_template
        return target

    monkeypatch.setattr(hf, "load_target", load)
    monkeypatch.setattr(capture, "load_target", load)
    return random_llama


@pytest.mark.parametrize("command", [["data", "regenerate", "--out", "regen.jsonl"],
                                     ["data", "prepare", "--regenerate", "--out", "feat"]])
def test_a_regeneration_refusal_names_the_conversations_file(refusing_target, tmp_path, capsys, monkeypatch, command):
    """`error: conversation twice, turn 5: chat template rejects the conversation: ...` named no file."""
    monkeypatch.chdir(tmp_path)
    convs = _jsonl(tmp_path / "c.jsonl", [*CONVERSATIONS, TWICE])
    assert main([*command, "--conversations", str(convs), "--target", str(refusing_target),
                 "--max-new-tokens", "2"]) == 2
    # the last line: transformers' warning may go before it, to a handler holding an earlier test's stderr
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {convs}: conversation twice, turn 5: chat template rejects the conversation: "
        "Conversation roles must alternate")


def test_costmodel_makes_a_missing_directory_as_the_other_writers_do(tmp_path, capsys):
    """Kept: eval, bench, probe and vocab build make an output's missing directories too (atomic.make_parent);
    refuse_unwritable tries a file in the nearest existing one."""
    out = tmp_path / "new" / "dir" / "model.json"
    assert main(["costmodel", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["preset"] and capsys.readouterr().out
