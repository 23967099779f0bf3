"""A greedy regeneration sets no sampling-only knob, so transformers does not warn that it ignores them."""
from __future__ import annotations

import logging

import pytest
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import regenerate
from drafter_lab.targets.hf import load_target

hf_logging = pytest.importorskip("transformers.utils.logging")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_regeneration_warns_of_no_ignored_generation_flag(random_llama, tmp_path, temperature):
    """At temperature 0 every call logged "The following generation flags are not valid and may be
    ignored: ['min_p', 'top_k']" (set to their neutral values, which only sampling reads)."""
    target = load_target(random_llama)
    convs = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(2)))[0]
    records, logger = _Records(), logging.getLogger("transformers")
    logger.addHandler(records)
    # transformers warns once per process, and an earlier test may have lowered its verbosity: either
    # would hide the warning whatever the order the tests run in
    hf_logging.warning_once.cache_clear()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    try:
        out = regenerate(target, convs, temperature=temperature, max_new_tokens=4, batch_size=2, seed=0,
                         show_progress=False)
    finally:
        logger.removeHandler(records)
        hf_logging.set_verbosity(verbosity)
    assert len(out) == 2
    assert not [m for m in records.messages if "not valid and may be ignored" in m], records.messages
