"""Review of regeneration: `data regenerate --server` against answers real servers send besides a finished
one (an aborted request answered with 200 and what it had generated so far, a choice without a message),
`data prepare`'s sampling flags given without --regenerate, and capture's padding with a pad id past the
embeddings."""

from __future__ import annotations

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations

URL = "http://127.0.0.1:9"


def _cli(tmp_path, *flags):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    return run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "out.jsonl", "--server", URL,
                   "--model", "m", "--concurrency", "1", *flags)


def test_an_aborted_answer_is_not_kept_as_the_targets(tmp_path, monkeypatch, capsys):
    """SGLang (an /abort_request, a paused engine) and vLLM answer an aborted request with HTTP 200,
    finish_reason "abort" and the text generated so far: it was kept as the target's answer, and the
    conversation's next turn asked after it."""
    aborted = {"on": True}

    def request_json(url, body, **kw):
        if aborted["on"] and any(m["role"] == "assistant" for m in body["messages"]):  # a second turn
            return {"choices": [{"index": 0, "finish_reason": "abort",
                                 "message": {"role": "assistant", "content": "half an ans"}}]}
        return {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "whole"}}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    assert _cli(tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error: ")]) == 1
    assert "finish_reason 'abort'" in err[-1] and f"{URL}/v1/chat/completions" in err[-1]
    assert not (tmp_path / "out.jsonl").exists()
    partial = tmp_path / "out.jsonl.partial"
    kept = partial.read_text() if partial.exists() else ""
    assert "half an ans" not in kept
    aborted["on"] = False  # the server is back: a resume asks again
    assert _cli(tmp_path) == 0
    convs, _ = read_conversations(tmp_path / "out.jsonl")
    answers = [m["content"] for c in convs for m in c.messages if m["role"] == "assistant"]
    assert answers and set(answers) == {"whole"}


@pytest.mark.parametrize("message", [None, "whole"])
def test_a_choice_without_a_message_object_is_one_line(tmp_path, monkeypatch, capsys, message):
    """A gateway's filtered answer (`"message": null`) or a message given as text: an AttributeError
    traceback from the worker thread."""
    monkeypatch.setattr(regenerate_server, "request_json",
                        lambda url, body, **kw: {"choices": [{"index": 0, "message": message}]})
    assert _cli(tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {tmp_path / 'c.jsonl'}: conversation ") and "no text at choices[0].message.content" in err
    assert f"'message': {message!r}" in err


@pytest.mark.parametrize("flag", [["--temperature", "0.7"], ["--max-new-tokens", "64"], ["--seed", "5"],
                                  ["--regen-batch-size", "4"]])
def test_sampling_flags_without_regenerate_are_refused(tmp_path, capsys, flag):
    """`data prepare --temperature 0.7` without --regenerate captured the recorded answers and said
    nothing of the flag (`data regenerate` refuses the other mode's flags)."""
    from drafter_lab.cli import main

    code = main(["data", "prepare", "--target", str(tmp_path / "t"), "--conversations", str(tmp_path / "c.jsonl"),
                 "--out", str(tmp_path / "f"), *flag])
    assert code == 2
    assert f"{flag[0]} applies with --regenerate" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_a_pad_id_past_the_embeddings_pads_with_one_inside(random_llama):
    """Capture right-pads a batch with the tokenizer's pad id: a <pad> added without resizing the
    embeddings was an IndexError in the target's embedding; the states are those of unpadded prompts."""
    import torch

    from drafter_lab.data.capture import capture_states
    from drafter_lab.targets.hf import load_target

    target = load_target(random_llama)
    items = [("a", torch.arange(3, 11), torch.ones(8)), ("b", torch.arange(20, 25), torch.ones(5))]
    got = {}
    capture_states(target, items, [1, 2, 3], torch.float32, 1, lambda *a, **k: None, lambda j, s: got.update({j: s}))
    target.tokenizer.add_special_tokens({"pad_token": "<new-pad>"})  # the next id: one past the embeddings
    assert target.tokenizer.pad_token_id == target.model.get_input_embeddings().num_embeddings
    padded = {}
    capture_states(target, items, [1, 2, 3], torch.float32, 2, lambda *a, **k: None,
                   lambda j, s: padded.update({j: s}))
    for j in got:
        assert torch.allclose(padded[j].aux_hidden, got[j].aux_hidden, atol=1e-5)


def test_local_regeneration_with_a_pad_id_past_the_embeddings(random_llama):
    """`generate` left-pads prompts with the tokenizer's pad id and feeds it back for finished rows: a <pad>
    added without resizing the embeddings was an IndexError; the answers are those padded with an id inside."""
    from drafter_lab.data.regenerate import generate_texts, generation_config
    from drafter_lab.targets.hf import load_target

    target = load_target(random_llama)
    prompts = ["def f(x):\n    return", "import os\nimport sys\nclass A:\n    pass\n\ndef g():"]
    want = generate_texts(target, prompts, generation_config(target, 0.0, 6))
    target.tokenizer.add_special_tokens({"pad_token": "<new-pad>"})
    assert generate_texts(target, prompts, generation_config(target, 0.0, 6)) == want
