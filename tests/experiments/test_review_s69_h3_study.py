"""The study's served evaluation names its own field, served_steps, where the engine refuses its steps
(session 69, h3)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from drafter_lab.errors import LabError
from drafter_lab.experiments import study
from drafter_lab.experiments.config import get_config
from drafter_lab.spec.ngram_config import NgramConfig


@pytest.mark.parametrize("drafting", ["eagle", "ngram"])
def test_a_served_eval_past_the_targets_positions_names_served_steps(random_llama, source, conversations_writer,
                                                                     tmp_path, drafting):
    """`experiment --served-steps 2000` on a target of 1024 positions was refused as `steps 2000 with ...`:
    the study has no steps field (its arms train `arm_steps`, a TTT `ttt_steps`)."""
    from drafter_lab.data.conversations import read_conversations
    from drafter_lab.spec.eval import render_prompts
    from drafter_lab.targets.hf import load_target

    prompts = conversations_writer(tmp_path / "eval.jsonl", 3)
    cfg = dataclasses.replace(get_config("smoke"), served_eval=True, served_prompts=2, served_steps=2000, device="cpu")
    tokenizer = load_target(random_llama).tokenizer
    longest = max(map(len, render_prompts(tokenizer, read_conversations(prompts, prompts=True)[0][:2])))
    drafter = source if drafting == "eagle" else NgramConfig()
    with pytest.raises(LabError) as e:
        study._served(cfg, drafter, random_llama, prompts)
    last = longest + cfg.max_new_tokens + 2000 - 2
    assert str(e.value) == (f"served_steps 2000 with max_new_tokens {cfg.max_new_tokens} takes the longest prompt "
                            f"({longest} tokens) to position {last}, past the target's max_position_embeddings 1024")


def test_the_served_eval_decodes_a_greedy_chain_one_prompt_at_a_time_from_user_turns(random_llama, tmp_path,
                                                                                     monkeypatch):
    """Eval prompts are user turns alone (a training read skipped them as having no answer), decoded as a
    chain of served_steps, batch 1, greedy, at the study's seed and max_new_tokens."""
    from drafter_lab.spec import eval as spec_eval

    prompts = tmp_path / "eval.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [{"role": "user", "content": f"x = {i}"}]})
                               + "\n" for i in range(3)))
    seen = {}
    monkeypatch.setattr(spec_eval, "evaluate", lambda target, drafter, convs, **kw: seen.update(convs=convs, **kw))
    cfg = dataclasses.replace(get_config("smoke"), served_eval=True, served_prompts=2, served_steps=3, seed=7,
                              device="cpu")
    study._served(cfg, NgramConfig(), random_llama, prompts)
    assert [c.id for c in seen.pop("convs")] == ["c0", "c1"]
    assert seen == {"steps": 3, "topk": 1, "draft_tokens": 3, "batch": 1, "max_new_tokens": cfg.max_new_tokens,
                    "temperature": 0.0, "seed": 7}


def test_a_two_level_sweep_resumed_with_levels_added_or_dropped_is_the_same_study():
    """Each level of a sweep has its own directory: two levels are a sweep as much as three (a level added
    trains, one dropped is left out); one level is no sweep, so another single level is another study."""
    from drafter_lab.config import to_dict

    cfg = get_config("smoke")
    for before, now in (([0.0, 1.0], [0.0, 1.0, 2.0]), ([0.0, 1.0, 2.0], [0.0, 1.0]), ([0.0, 1.0], [0.0, 2.0])):
        recorded = {**to_dict(cfg), "drift_levels": before}
        assert study.config_changes(recorded, dataclasses.replace(cfg, drift_levels=now), None) == []
    recorded = {**to_dict(cfg), "drift_levels": [1.0]}
    assert study.config_changes(recorded, dataclasses.replace(cfg, drift_levels=[2.0]), None) == ["drift_levels"]


def test_a_draft_vocabulary_as_large_as_the_targets_is_a_study():
    from drafter_lab.targets.presets import resolve

    cfg = dataclasses.replace(get_config("smoke"), device="cpu", threads=1)
    vocab = resolve(cfg.target_preset).vocab_size
    study.check_study(dataclasses.replace(cfg, draft_vocab_size=vocab))  # every token drafted: allowed
    with pytest.raises(LabError, match=rf"^draft_vocab_size must be at most {vocab} \(target preset "
                                       rf"{cfg.target_preset}'s vocab size\), got {vocab + 1}$"):
        study.check_study(dataclasses.replace(cfg, draft_vocab_size=vocab + 1))
