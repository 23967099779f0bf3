"""Review s65 of targets/train_lm.py, on a tiny stand-in model: the learning-rate schedule, which
conversation starts a window may begin at, the batch's make-up from its sources' shares, weight decay
kept off the 1-d parameters, and the loss figures the pair's record reports."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from drafter_lab.errors import LabError
from drafter_lab.targets import train_lm as tl


def test_the_schedule_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    assert tl._lr_at(0, 10, 1.0, 4, True) == pytest.approx(0.25)  # the first step already learns
    assert tl._lr_at(3, 10, 1.0, 4, True) == pytest.approx(1.0)
    assert tl._lr_at(4, 10, 1.0, 4, True) == pytest.approx(1.0)  # the decay starts at the peak
    assert tl._lr_at(7, 10, 1.0, 4, True) == pytest.approx(0.55)  # halfway through the decay's 6 steps
    assert tl._lr_at(10, 10, 1.0, 4, True) == pytest.approx(0.1)
    assert tl._lr_at(9, 10, 2.0, 4, False) == 2.0


def test_a_window_begins_only_at_a_conversation_start_whose_window_fits():
    stream = tl.TokenStream(ids=torch.arange(10), starts=torch.tensor([0, 6, 7]))
    got = tl.sample_windows(stream, 200, 3, torch.Generator().manual_seed(0))
    assert got.shape == (200, 4)
    # 6 + 4 tokens ends exactly at the stream's end: allowed; 7 would run past it
    assert set(got[:, 0].tolist()) == {0, 6}
    assert torch.equal(got[got[:, 0] == 6][0], torch.tensor([6, 7, 8, 9]))
    with pytest.raises(LabError, match="training text too short: 10 tokens, window needs 11"):
        tl.sample_windows(stream, 1, 10, torch.Generator().manual_seed(0))


def test_windows_cover_the_stream_and_drop_the_tail():
    stream = tl.TokenStream(ids=torch.arange(10), starts=torch.tensor([0]))
    assert stream.windows(3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_each_conversation_starts_where_the_previous_ended():
    class Tok:
        def apply_chat_template(self, messages, tokenize):
            return "".join(m["content"] for m in messages)

        def __call__(self, texts, add_special_tokens):
            return {"input_ids": [[ord(c) for c in t] for t in texts]}

    records = [{"conversations": [{"content": c}]} for c in ("ab", "cde", "f")]
    stream = tl.encode_conversations(Tok(), records)
    assert stream.starts.tolist() == [0, 2, 5]
    assert stream.ids.tolist() == [ord(c) for c in "abcdef"]


class Tiny(torch.nn.Module):
    """Bigram logits plus a 1-d bias; records each batch it is given."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(vocab, vocab))
        self.bias = torch.nn.Parameter(torch.ones(vocab))
        self.batches: list[torch.Tensor] = []

    def forward(self, input_ids):
        self.batches.append(input_ids.clone())
        return SimpleNamespace(logits=self.table[input_ids] + self.bias)


def test_weight_decay_is_kept_off_the_one_dimensional_parameters():
    model = Tiny(4)
    groups = tl._optimizer(model, 1e-3, 0.5).param_groups
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(1, 0.5), (1, 0.0)]
    assert groups[0]["params"][0] is model.table and groups[1]["params"][0] is model.bias


def test_the_batch_takes_each_source_its_share_and_the_figures_are_the_runs(monkeypatch):
    losses = []

    @contextlib.contextmanager
    def recording(description, total):
        yield lambda n=1, **fields: losses.append(fields["loss"])

    monkeypatch.setattr(tl, "progress", recording)
    # two streams of disjoint tokens, so each window tells its source
    a = tl.TokenStream(ids=torch.arange(0, 40) % 4, starts=torch.arange(0, 40, 8))
    b = tl.TokenStream(ids=4 + torch.arange(0, 40) % 4, starts=torch.arange(0, 40, 8))
    model = Tiny(8)
    out = tl.train_lm(model, [(a, 0.5), (b, 0.5)], steps=20, batch_size=3, seq_len=5, lr=0.05, warmup_steps=2,
                      weight_decay=0.0, decay=True, seed=0, description="t")
    # round(1.5) == 2 for both: the first source gives up the extra window, so the batch stays 3
    for batch in model.batches:
        assert batch.shape == (3, 5)
        assert (batch[:1] < 4).all() and (batch[1:] >= 4).all()
    assert out["steps"] == 20 and out["tokens"] == 20 * 3 * 5  # the tokens predicted, not the windows' 6
    assert len(losses) == 20
    assert out["first_loss"] == losses[0]
    assert out["final_loss"] == pytest.approx(sum(losses[-2:]) / 2)  # the last tenth of the steps
    assert out["final_loss"] < out["first_loss"]
