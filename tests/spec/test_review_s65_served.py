"""Mutation audit (review s65) of the served eval: URLs that name no port, what a baseline server
that does not speculate reports, and the numbers the served eval derives from a server's counts."""

from __future__ import annotations

import threading

import pytest

from drafter_lab import cli
from drafter_lab.errors import LabError
from drafter_lab.httpjson import HTTPStatusError
from drafter_lab.spec import served


@pytest.mark.parametrize("url, problem", [("http://localhost:99999", "Port out of range"),
                                          ("http://localhost:x", "could not be cast")])
def test_a_url_whose_port_is_no_port_is_one_line(url, problem):
    """Comparing --server with --baseline-server read the port, whose ValueError was a traceback."""
    cfg = served.ServedConfig(url=url, baseline_url="http://localhost:30000")
    with pytest.raises(LabError, match=problem) as e:
        served.check_settings(cfg)
    assert str(e.value).startswith(f"{url}: ")


def test_eval_with_a_bad_port_and_a_baseline_server_is_refused_as_the_flag_is_read(tmp_path, capsys):
    argv = ["eval", "--server", "http://localhost:99999", "--baseline-server", "http://localhost:30000",
            "--target", str(tmp_path / "t"), "--prompts", str(tmp_path / "missing.jsonl")]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "argument --server: expected a base URL like http://localhost:30000, got 'http://localhost:99999' " \
           "(Port out of range 0-65535)" in capsys.readouterr().err


def _vllm(before: dict, after: dict) -> served.VLLM:
    server = served.VLLM("http://127.0.0.1:9", served.ServedConfig(url="http://127.0.0.1:9", model="m"))
    server.before = before
    server._counters = lambda: after
    return server


ANSWERS = [served.Answer([1, 2, 3], 3, {}, 0.1, 0.2, 2)]


def test_vllm_acceptance_is_one_plus_accepted_per_draft_with_its_histogram():
    """10 drafts accepted 12 tokens (8 at the first position, 4 at the second): 2 accepted none, 4 one,
    4 two; counters already there before the eval are left out."""
    before = {"drafts": 10.0, "accepted": 20.0, "per_pos": {0: 8.0, 1: 5.0}}
    after = {"drafts": 20.0, "accepted": 32.0, "per_pos": {0: 16.0, 1: 9.0}}
    accept, drafts, hist = _vllm(before, after).acceptance(ANSWERS)
    assert (accept, drafts, hist) == (pytest.approx(2.2), 10, {"1": 2, "2": 4, "3": 4})


def test_vllm_counters_that_went_back_are_refused_even_where_drafts_grew_again():
    """A server restarted mid-eval can count more drafts than before yet fewer accepted tokens: the
    difference was an accept length below 1."""
    before = {"drafts": 10.0, "accepted": 30.0, "per_pos": {}}
    after = {"drafts": 12.0, "accepted": 5.0, "per_pos": {}}
    with pytest.raises(LabError, match="went back during the eval"):
        _vllm(before, after).acceptance(ANSWERS)


@pytest.mark.parametrize("after_per_pos", [{0: 6.0, 1: 9.0}, {0: 16.0}], ids=["went-back", "gone"])
def test_a_per_position_counter_that_went_back_is_refused(after_per_pos):
    """The totals grew, but position 0 counted fewer accepted drafts than before (or position 1 vanished):
    the histogram would hold a negative count of steps."""
    before = {"drafts": 10.0, "accepted": 20.0, "per_pos": {0: 8.0, 1: 5.0}}
    after = {"drafts": 20.0, "accepted": 32.0, "per_pos": after_per_pos}
    with pytest.raises(LabError, match="went back during the eval"):
        _vllm(before, after).acceptance(ANSWERS)


def test_a_position_first_counted_during_the_eval_counts_from_zero():
    """A position the server had not counted before the eval (absent from the first read) starts at 0."""
    before = {"drafts": 10.0, "accepted": 8.0, "per_pos": {0: 8.0}}
    after = {"drafts": 20.0, "accepted": 20.0, "per_pos": {0: 16.0, 1: 4.0}}
    assert _vllm(before, after).acceptance(ANSWERS) == (pytest.approx(2.2), 10, {"1": 2, "2": 4, "3": 4})


class _Recorder:
    """A server that answers every request at once, recording the tokens each asked for."""

    def __init__(self):
        self.asked: list[int] = []

    def generate(self, ids, max_new_tokens):
        self.asked.append(max_new_tokens)
        return served.Answer(list(range(max_new_tokens)), max_new_tokens, {}, 0.0, 0.0, 1)


@pytest.mark.parametrize("max_new_tokens, warmup", [(3, 3), (64, served.WARMUP_TOKENS)])
def test_the_warm_up_asks_for_no_more_tokens_than_the_prompts(max_new_tokens, warmup):
    """A --max-new-tokens lowered to fit the context must hold for the warm-up too, which a server
    would otherwise refuse as past the context length."""
    server = _Recorder()
    cfg = served.ServedConfig(url="http://127.0.0.1:9", max_new_tokens=max_new_tokens)
    answers, _ = served._decode(server, [[1, 2], [3]], cfg, speculative=False)
    assert server.asked == [warmup, max_new_tokens, max_new_tokens] and len(answers) == 2


def test_no_request_is_sent_after_the_first_failure():
    """The slot whose request failed takes no further one: once its thread has ended, the prompts after
    the failed one were never sent (the eval is abandoned, and the server spared their work)."""
    sent = []

    class Failing(_Recorder):
        def generate(self, ids, max_new_tokens):
            sent.append(ids)
            if ids == [1]:
                raise LabError("the server aborted the request", "http://s/generate")
            return super().generate(ids, max_new_tokens)

    before = set(threading.enumerate())
    with pytest.raises(LabError, match="aborted"):
        served._decode(Failing(), [[0], [1], [2], [3]], served.ServedConfig(url="http://s"), speculative=False)
    for thread in set(threading.enumerate()) - before:
        thread.join(30)
    assert sent == [[0], [0], [1]]  # the warm-up, then prompts 0 and 1


@pytest.mark.parametrize("status, named", [(400, True), (413, True), (422, True), (429, False), (500, False)])
def test_a_prompt_the_server_refuses_is_named_but_not_one_it_is_too_busy_for(status, named):
    """413 (too large) and 422 (unprocessable) refuse the prompt itself, as a 400 does; a 429 or a 5xx
    is the server's state, raised as it came."""
    class Refusing(_Recorder):
        def generate(self, ids, max_new_tokens):
            if ids == [3, 4, 5]:
                raise HTTPStatusError(status, "too long", "http://s/generate")
            return super().generate(ids, max_new_tokens)

    cfg = served.ServedConfig(url="http://s", max_new_tokens=4)
    with pytest.raises(LabError) as e:
        served._decode(Refusing(), [[1], [3, 4, 5]], cfg, speculative=False, names=["a", "b"])
    assert str(e.value).startswith("prompt 1 (b), 3 tokens + --max-new-tokens 4, was refused") == named
    assert isinstance(e.value, HTTPStatusError) != named


def test_a_request_without_a_verify_step_leaves_the_histogram_standing():
    """A request that ended at its first token ran no verify step and may carry no histogram: the
    others' histogram is still the eval's."""
    metas = [{"completion_tokens": 1, "spec_verify_ct": 0},
             {"completion_tokens": 5, "spec_verify_ct": 2, "spec_accept_histogram": [0, 0, 2]}]
    assert served.acceptance(metas, "http://s/generate") == (2.0, 2, {"1": 0, "2": 0, "3": 2})


def test_no_retries_and_greedy_are_settings_but_an_infinite_temperature_is_not():
    served.check_settings(served.ServedConfig(url="http://s", retries=0, temperature=0.0))
    with pytest.raises(LabError, match="^temperature must be a finite number >= 0, got inf$"):
        served.check_settings(served.ServedConfig(url="http://s", temperature=float("inf")))


@pytest.mark.parametrize("url, baseline", [("http://localhost:80", "http://127.0.0.1/"),
                                           ("https://h.example", "HTTPS://h.example:443")])
def test_a_baseline_at_the_servers_default_port_is_the_server_itself(url, baseline):
    with pytest.raises(LabError, match="is the --server itself"):
        served.check_settings(served.ServedConfig(url=url, baseline_url=baseline))


def test_a_histogram_wider_than_the_settings_depth_keeps_every_verify_step(monkeypatch):
    """The histogram is filled with zeros up to the settings' depth, but a server's histogram that
    reaches past it (stale or missing settings) loses none of its verify steps."""
    class FakeSGLang(_Recorder):
        def __init__(self, url, cfg):
            super().__init__()

        def settings(self):
            return {"speculative_num_steps": 1, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}

        def generate(self, ids, max_new_tokens):
            meta = {"completion_tokens": 5, "spec_verify_ct": 2, "spec_accept_histogram": [0, 0, 2]}
            return served.Answer([7] * 5, 5, meta, 0.1, 0.2, 3)

        def start_counting(self):
            pass

        def acceptance(self, answers):
            return served.acceptance([a.meta for a in answers], "http://s/generate")

    monkeypatch.setattr(served, "SGLang", FakeSGLang)
    monkeypatch.setattr(served, "render_prompts", lambda *args: [[1, 2]])
    monkeypatch.setattr(served, "rendered_with", lambda *args: {})
    r = served.served_evaluate(None, [type("Conversation", (), {"id": "a"})], served.ServedConfig(url="http://s"))
    assert r["accept_histogram"] == {"1": 0, "2": 0, "3": 2} and r["verify_steps"] == 2
    assert (r["config"]["steps"], r["config"]["draft_tokens"], r["config"]["drafting"]) == (1, 1, "chain")


def test_a_prompt_the_baseline_server_refuses_is_named_too(monkeypatch):
    class FakeSGLang(_Recorder):
        def __init__(self, url, cfg):
            super().__init__()
            self.url = url

        def settings(self):
            return {}

        def speculates(self):
            return False

        def generate(self, ids, max_new_tokens):
            if self.url == "http://base" and ids == [3]:
                raise HTTPStatusError(400, "too long", "http://base/generate")
            meta = {"completion_tokens": 3, "spec_verify_ct": 1}
            return served.Answer([7] * 3, 3, meta, 0.1, 0.2, 2)

        def start_counting(self):
            pass

        def acceptance(self, answers):
            return served.acceptance([a.meta for a in answers], "http://s/generate")

    monkeypatch.setattr(served, "SGLang", FakeSGLang)
    monkeypatch.setattr(served, "render_prompts", lambda *args: [[1, 2], [3]])
    monkeypatch.setattr(served, "rendered_with", lambda *args: {})
    conversations = [type("Conversation", (), {"id": name}) for name in ("a", "b")]
    with pytest.raises(LabError, match=r"^prompt 1 \(b\), 1 tokens"):
        served.served_evaluate(None, conversations, served.ServedConfig(url="http://s", baseline_url="http://base"))
