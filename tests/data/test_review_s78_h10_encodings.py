"""encodings() behaviours a mutation audit (s78, h10) found unpinned: a refused conversation first or in the
middle is yielded in its own place, in this process; and what a spawned worker runs (`_start`, `_encode`),
and the loop over the pool's results, here driven in this process so that a mutation of them shows."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data import encodings as encodings_module
from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.chat import TemplateRefusal
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.encodings import encoded, encodings
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_tokenizer

REFUSE = "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('begin with a user turn') }}{% endif %}"


@pytest.fixture
def refusing(random_llama, tmp_path):
    """A tokenizer whose template refuses a chat that opens with an assistant turn, and four
    conversations: refused, good, refused, good."""
    tok = load_tokenizer(random_llama)
    tok.chat_template = REFUSE + tok.chat_template
    good = make_conversations(2)
    rows = [{"id": f"bad{i}", "messages": [{"role": "assistant", "content": f"first {i}"}]} for i in range(2)]
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [rows[0], good[0], rows[1], good[1]]))
    return tok, convs


def same(out, want):
    """`out` (Encoded, or a refusal) as `want`: the refusal's message, or the encoding's ids, mask and notes."""
    if isinstance(want, LabError):
        return type(out) is type(want) and str(out) == str(want)
    return not isinstance(out, LabError) and (out.ids.tolist(), out.mask.tolist(), out.thought, out.calls) == \
        (want.ids.tolist(), want.mask.tolist(), want.thought, want.calls)


def expected(convs, tok, cfg):
    out = []
    for conv in convs:
        try:
            out.append(encoded(conv, tok, cfg, frozenset()))
        except LabError as e:
            out.append(e)
    return out


@contextlib.contextmanager
def counting_into(steps: list):
    """maybe_progress's stand-in: each advance noted in `steps`."""
    yield lambda n=1, **fields: steps.append(n)


def test_a_refusal_first_or_in_the_middle_is_yielded_in_its_own_place_in_this_process(refusing, monkeypatch):
    # not the conversation before it again, nor an unbound name where it comes first; counted in the progress
    def no_pool(*args, **kwargs):
        raise AssertionError("a process pool was started for one worker")

    tok, convs = refusing
    steps = []
    monkeypatch.setattr(encodings_module, "ProcessPoolExecutor", no_pool)
    monkeypatch.setattr(encodings_module, "maybe_progress", lambda description, total, show: counting_into(steps))
    cfg = CaptureConfig(max_length=4096, tokenize_workers=1)
    out = list(encodings(convs, tok, cfg, frozenset(), show=True))
    assert sum(steps) == len(convs)
    assert [isinstance(e, TemplateRefusal) for e in out] == [True, False, True, False]
    assert [str(out[0]).split(":")[0], str(out[2]).split(":")[0]] == ["conversation bad0", "conversation bad1"]
    want = expected(convs, tok, cfg)
    assert all(same(o, w) for o, w in zip(out, want))
    assert out[1].ids.tolist() != out[3].ids.tolist()


def test_a_worker_starts_with_one_thread_and_encodes_as_lists_or_returns_the_error(refusing, random_llama,
                                                                                   tmp_path, monkeypatch):
    """What a spawned worker runs, called here: its results cross back as plain lists, its LabError as
    the value (a refusal stays one), so the parent can yield it in place or raise it."""
    tok, convs = refusing
    cfg = CaptureConfig(max_length=4096)
    monkeypatch.setattr(encodings_module, "_WORKER", {})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        encodings_module._start(tok, cfg, frozenset())
        assert torch.get_num_threads() == 1  # the workers share the cores
    finally:
        torch.set_num_threads(threads)
    for conv, want in zip(convs, expected(convs, tok, cfg)):
        got = encodings_module._encode(conv)
        if isinstance(want, LabError):
            assert isinstance(got, TemplateRefusal) and str(got) == str(want)
        else:
            assert got == (want.ids.tolist(), want.mask.tolist(), want.thought, want.calls)
            assert type(got[0]) is list and type(got[1]) is list
    # an error that is not a refusal comes back as itself too (the parent raises it)
    plain, _ = read_conversations(write_jsonl(tmp_path / "p.jsonl", make_conversations(1)))
    encodings_module._start(load_tokenizer(random_llama), CaptureConfig(max_length=4096, token_exact=True), frozenset())
    torch.set_num_threads(threads)  # _start set this process's, as a worker's
    got = encodings_module._encode(plain[0])
    assert isinstance(got, LabError) and not isinstance(got, TemplateRefusal)
    assert str(got).startswith(f"conversation {plain[0].id}: assistant turn"), str(got)


@pytest.fixture
def pool_here(monkeypatch):
    """The process pool swapped for one thread in this process that runs the same initializer and
    `_encode`: the spawn path's loop, checked where a mutation runner can see it. Records each pool
    made and each shutdown; restores the thread count `_start` sets."""
    made, shutdowns = [], []

    class Pool(ThreadPoolExecutor):
        def __init__(self, workers, mp_context, initializer, initargs):
            made.append((workers, mp_context.get_start_method(), initializer, initargs))
            super().__init__(1, initializer=initializer, initargs=initargs)  # one thread: a tokenizer is not shared

        def shutdown(self, wait=True, *, cancel_futures=False):
            shutdowns.append(cancel_futures)
            super().shutdown(wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(encodings_module, "ProcessPoolExecutor", Pool)
    monkeypatch.setattr(encodings_module, "_WORKER", {})
    threads = torch.get_num_threads()
    yield made, shutdowns
    torch.set_num_threads(threads)


@pytest.mark.parametrize("workers", [2, 17])  # 17: more workers than the 16 chunks per worker the pool is cut into
def test_workers_yield_each_encoding_or_refusal_in_file_order_and_count_each(refusing, pool_here, monkeypatch, workers):
    tok, convs = refusing
    made, shutdowns = pool_here
    steps = []
    monkeypatch.setattr(encodings_module, "maybe_progress", lambda description, total, show: counting_into(steps))
    cfg = CaptureConfig(max_length=4096, tokenize_workers=workers)
    out = list(encodings(convs, tok, cfg, frozenset(), show=True))
    assert made == [(workers, "spawn", encodings_module._start, (tok, cfg, frozenset()))]
    assert [isinstance(e, TemplateRefusal) for e in out] == [True, False, True, False]
    assert all(same(o, w) for o, w in zip(out, expected(convs, tok, cfg)))
    assert out[1].ids.dtype == torch.long and out[1].mask.dtype == torch.bool
    assert sum(steps) == len(convs) and shutdowns == [True]


def test_two_workers_under_strict_raise_the_first_refusal_and_drop_the_rest(refusing, pool_here):
    tok, convs = refusing
    _, shutdowns = pool_here
    cfg = CaptureConfig(max_length=4096, tokenize_workers=2, strict=True)
    with pytest.raises(TemplateRefusal, match="^conversation bad0: chat template rejects the conversation"):
        list(encodings(convs, tok, cfg, frozenset(), show=False))
    assert shutdowns == [True]


def test_a_caller_stopping_early_drops_what_the_workers_have_not_begun(refusing, pool_here):
    tok, convs = refusing
    _, shutdowns = pool_here
    gen = encodings(convs[1:], tok, CaptureConfig(max_length=4096, tokenize_workers=2), frozenset(), show=False)
    assert not isinstance(next(gen), LabError)
    assert shutdowns == []
    gen.close()
    assert shutdowns == [True]
