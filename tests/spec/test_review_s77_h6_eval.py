"""Eval, mutation audit s77/h6: latency summaries (an empty side, the p90's rank) and which turns a prompt is\nrendered from."""

from __future__ import annotations

import pytest

from drafter_lab.data.conversations import Conversation
from drafter_lab.errors import LabError
from drafter_lab.spec.eval import latency, pool, render_prompts
from drafter_lab.targets.hf import load_tokenizer


def test_a_side_whose_requests_all_ended_at_their_first_token_has_no_time_per_output_token():
    """One-token requests have a TTFT and no TPOT: their summary is empty, not a StatisticsError."""
    lat = latency({"ttft_ms": [3.0], "tpot_ms": []}, {"ttft_ms": [1.0, 2.0], "tpot_ms": [4.0]})
    assert lat["spec"] == {"ttft_ms": {"median": 3.0, "p90": 3.0}, "tpot_ms": {"median": None, "p90": None}}
    assert lat["baseline"]["tpot_ms"] == {"median": 4.0, "p90": 4.0}
    assert lat["tpot_speedup"] is None


def test_the_p90_is_the_nearest_rank():
    """Of ten requests the 9th fastest (nearest rank: ceil(0.9 n)), neither the slowest nor the 8th."""
    ms = [float(v) for v in (7, 3, 10, 1, 9, 5, 2, 8, 6, 4)]
    lat = latency({"ttft_ms": ms, "tpot_ms": ms[:3]}, {"ttft_ms": ms[:1], "tpot_ms": ms[:2]})
    assert lat["spec"]["ttft_ms"] == {"median": 5.5, "p90": 9.0}
    assert lat["spec"]["tpot_ms"] == {"median": 7.0, "p90": 10.0}  # ceil(2.7) = 3: the slowest of three
    assert lat["baseline"]["tpot_ms"] == {"median": 5.0, "p90": 7.0}


TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}: {{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}"
            "[gen]{% endif %}{% if day is defined %}[day {{ day }}]{% endif %}{% if tools %}[tools {{ tools | length }}]"
            "{% endif %}")


def _turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


@pytest.fixture
def tok(random_llama):
    tok = load_tokenizer(random_llama)
    tok.chat_template = TEMPLATE
    return tok


def test_a_prompt_is_rendered_from_the_turns_before_the_first_answer(tok):
    convs = [
        Conversation("answered", [_turn("system", "s"), _turn("user", "q1"), _turn("assistant", "a1"),
                                  _turn("user", "q2"), _turn("assistant", "a2")]),
        Conversation("unanswered", [_turn("system", "s"), _turn("user", "q1"), _turn("user", "q2")],
                     tools=[{"type": "function", "function": {"name": "f"}}]),
    ]
    texts = [tok.decode(ids) for ids in render_prompts(tok, convs, template_kwargs={"day": "d"})]
    assert texts == ["[system: s][user: q1][gen][day d]", "[system: s][user: q1][gen][day d][tools 1]"]


@pytest.mark.parametrize(("messages", "said"), [
    ([_turn("system", "s"), _turn("assistant", "a"), _turn("user", "q")], "has no user turn before its first "
                                                                         "assistant turn"),
    ([_turn("system", "s")], "has no user turn"),
])
def test_a_conversation_without_a_question_to_prompt_is_one_line(tok, tmp_path, messages, said):
    with pytest.raises(LabError) as e:
        render_prompts(tok, [Conversation("c3", messages)], tmp_path / "p.jsonl")
    assert str(e.value) == f"{tmp_path / 'p.jsonl'}: conversation c3 {said}"


def test_no_conversation_is_no_prompts_to_decode(tok, tmp_path):
    with pytest.raises(LabError) as e:
        render_prompts(tok, [], tmp_path / "p.jsonl")
    assert str(e.value) == f"{tmp_path / 'p.jsonl'}: no prompts to decode"


def test_pooled_live_rows_over_a_single_pass_are_that_pass_rows():
    """A set that made no pass (every request ended at its first token) weighs nothing: 3 rows over 1 pass."""
    one = {"verify_steps": 3, "served_accept_len": 2.0, "accept_histogram": None, "verify_passes": 1,
           "decode_passes": 1, "live_rows_per_pass": {"spec": 3.0, "baseline": 3.0}}
    none = {**one, "verify_steps": 1, "verify_passes": 0, "decode_passes": 0,
            "live_rows_per_pass": {"spec": 0.0, "baseline": 0.0}}
    assert pool({"a": one, "b": none})["live_rows_per_pass"] == {"spec": 3.0, "baseline": 3.0}
