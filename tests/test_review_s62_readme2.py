"""README "Reasoning models" through "How deep to draft" checked against the code (review s62, part 2)."""

from __future__ import annotations

import json

import pytest

from drafter_lab.cli import main
from drafter_lab.train.metrics_log import BEST_FILE, METRICS


@pytest.mark.parametrize("file, metrics, named", [
    (METRICS, '{"split": "val", "step": 5, "cond_acc_0": "0.5"}', 'cond_acc_0 "0.5"'),  # was a TypeError
    (METRICS, '{"split": "val", "step": 5, "cond_acc_0": NaN, "cond_acc_1": 0.5}', "cond_acc_0 NaN"),
    (METRICS, '{"split": "val", "step": 5, "cond_acc_0": 0.5, "cond_acc_1": 1.5}', "cond_acc_1 1.5"),
    (METRICS, '{"split": "val", "step": 5, "cond_acc_0": true}', "cond_acc_0 true"),
    (METRICS, '{"split": "val", "step": 5, "cond_acc_0": 0.5, "replay_accept_len_0": null}', "replay_accept_len_0 NaN"),
    (BEST_FILE, '{"step": 3, "validation": {"cond_acc_0": null}}', "cond_acc_0 null"),
])
def test_costmodel_refuses_a_runs_validation_that_is_no_numbers(tmp_path, capsys, file, metrics, named):
    """`costmodel --inputs RUN_DIR` priced a hand-edited validation's text with a traceback, and its nulls
    as NaN accept lengths after logging them: one line naming the file and the metric instead."""
    (tmp_path / file).write_text(metrics + "\n")
    assert main(["costmodel", "--inputs", str(tmp_path), "--sampled"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{tmp_path / file}: its validation at step" in err and named in err, err


def test_costmodel_prices_a_runs_validation_as_before(tmp_path, capsys):
    (tmp_path / METRICS).write_text(json.dumps(
        {"split": "val", "step": 5, "cond_acc_0": 0.8, "cond_acc_1": 0.5, "replay_accept_len_0": 1.4}) + "\n")
    assert main(["costmodel", "--inputs", str(tmp_path)]) == 0
    assert "1.80, 2.20 at 1..2 steps" in capsys.readouterr().err
    assert main(["costmodel", "--inputs", str(tmp_path), "--sampled"]) == 0
    assert "1.40 at 1..1 steps" in capsys.readouterr().err


PARALLEL_REFUSED = (  # Llama 3.1's manner: one call per turn, refused where a turn makes several
    "{% for m in messages %}{% if m.tool_calls is defined and m.tool_calls | length > 1 %}"
    "{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{% for c in m.tool_calls | default([]) %}{{ c.function.name }}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_regeneration_meets_a_templates_refusal_before_generating(random_llama, monkeypatch):
    """A refusal in a later round (the prompt of the answer after parallel calls) ended a local regeneration
    only after the earlier rounds' generation, which a rerun without that conversation could not resume."""
    from drafter_lab.data import regenerate as regen
    from drafter_lab.data.conversations import Conversation
    from drafter_lab.errors import LabError
    from drafter_lab.targets.hf import load_target

    target = load_target(random_llama)
    target.tokenizer.chat_template = PARALLEL_REFUSED
    call = {"type": "function", "function": {"name": "get", "arguments": {}}}
    convs = [Conversation("ok", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
             Conversation("par", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": "more"},
                                  {"role": "assistant", "content": "", "tool_calls": [call, call]},
                                  {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
                                  {"role": "assistant", "content": "b"}])]
    generated = []
    monkeypatch.setattr(regen, "generate_texts", lambda target, prompts, config: generated.append(prompts) or [])
    with pytest.raises(LabError, match="conversation par, turn 7: chat template rejects the conversation"):
        regen.regenerate(target, convs, max_new_tokens=2, show_progress=False)
    assert generated == []


@pytest.mark.parametrize("histogram, said", [
    ({"1": 3, "2": -5}, "counts must be whole numbers (>= 0)"),  # was "holds no verify steps": it holds 3
    ({"0": 3, "1": 2}, "a served accept length of 0: each verify step emits at least 1"),  # the same
    ({"1": 0}, "holds no verify steps"),
])
def test_costmodel_says_what_is_wrong_with_an_accept_histogram(tmp_path, capsys, histogram, said):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"accept_histogram": histogram, "config": {"steps": 3, "topk": 1}}))
    assert main(["costmodel", "--inputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: accept_histogram " in err and said in err, err
