"""Captures from two threads at once (an online run's prefetch thread loads the next batch while the
main thread validates, both through the target) each keep their own forward's states: the hooks of
both fired on both forwards, so one saw each state twice and the run stopped ("hidden state 4 was seen
2 times"), depending on timing (a fresh-clone CI run of tests/train/test_resume_ddp.py caught it)."""

from __future__ import annotations

import threading

import torch

from drafter_lab.targets.hf import load_target
from drafter_lab.targets.hidden import run_capturing


def test_captures_on_two_threads_each_keep_their_own_states(random_llama):
    model = load_target(random_llama, tokenizer=False).model
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randint(0, model.config.vocab_size, (2, 48), generator=g) for _ in range(2)]
    with torch.no_grad():
        want = [model(input_ids=ids, output_hidden_states=True).hidden_states for ids in inputs]
    errors, start = [], threading.Barrier(2)

    def run(k: int) -> None:
        start.wait()
        try:
            for _ in range(25):
                with torch.no_grad():
                    _, hs = run_capturing(model, [2, 4, 5], input_ids=inputs[k])
                for i in (2, 4, 5, 8):
                    assert torch.equal(hs[i], want[k][i]), f"thread {k}: state {i} is another forward's"
        except Exception as e:  # noqa: BLE001 - reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
