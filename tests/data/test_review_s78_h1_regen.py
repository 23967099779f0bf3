"""Review (s78 h1) of regenerate.py, from the third mutation audit: the CUDA generator's fork and
the state a GPU run records, a pad token the embeddings lack, and an unknown token in an answer of a tokenizer
without think tags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from drafter_lab.data import regenerate as regenerate_module
from drafter_lab.data.conversations import Conversation
from drafter_lab.data.regenerate import generate_texts, generation_config, regenerate


@pytest.fixture(scope="module")
def target(random_llama):
    from drafter_lab.targets.hf import load_target

    return load_target(random_llama)


@pytest.fixture
def answered_a(monkeypatch):
    monkeypatch.setattr(regenerate_module, "generate_texts", lambda target, prompts, gen: [("a", [5])] * len(prompts))


@pytest.mark.parametrize("device", [torch.device("cpu"), torch.device("cuda", 0)])
def test_the_targets_generator_is_forked_so_the_callers_draws_on_as_before(target, answered_a, monkeypatch, device):
    """A target on a GPU samples from its CUDA generator, which the run seeds: forked, the caller's stream
    is left where it was. Recorded through a double of `fork_rng`, since the machine may have no GPU (and
    the double forks only the CPU's)."""
    forked, real = [], torch.random.fork_rng

    def fork_rng(devices=None, **kw):
        forked.append(list(devices))
        return real(devices=[], **kw)

    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)
    placed = SimpleNamespace(tokenizer=target.tokenizer, model=target.model, fingerprint=target.fingerprint,
                             device=device)
    out = regenerate(placed, [Conversation(id="c", messages=[{"role": "user", "content": "q"}])],
                     show_progress=False)
    assert out[0].messages[1]["content"] == "a"
    assert forked == [[device] if device.type == "cuda" else []]


def test_a_pad_token_past_the_embeddings_pads_with_an_embedded_id(random_llama):
    """A <pad> added to the tokenizer without resizing the model: the left padding of the shorter prompt
    must not look up that id (past the embeddings), and the answers are those of each prompt alone."""
    from drafter_lab.targets.hf import load_target

    target = load_target(random_llama)  # its own: the tokenizer is changed
    tok = target.tokenizer
    tok.add_special_tokens({"pad_token": "<pad-past-the-embeddings>"})
    assert tok.pad_token_id >= target.model.get_input_embeddings().num_embeddings
    gen = generation_config(target, 0.0, 4)
    prompts = ["def join(a, *p):", "import os\nimport sys\n\ndef main(argv):\n    return argv"]
    assert len(tok(prompts[0])["input_ids"]) < len(tok(prompts[1])["input_ids"])
    assert generate_texts(target, prompts, gen) == [generate_texts(target, [p], gen)[0] for p in prompts]


def test_an_unknown_token_is_no_think_tag_to_keep(random_llama):
    """A tokenizer without think tags converts them to its unknown token, itself special: an answer that
    holds it reads as its plain decode, without the token."""
    from drafter_lab.data.regenerate import answer_fields
    from drafter_lab.targets.hf import load_tokenizer

    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"unk_token": "<unk>"})
    assert tok.convert_tokens_to_ids("<think>") == tok.unk_token_id
    ids = tok("It joins", add_special_tokens=False)["input_ids"] + [tok.unk_token_id] + \
        tok(" path parts.", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert answer_fields(tok, text, ids) == {"content": text} and "<unk>" not in text


def test_a_gpu_runs_state_records_and_restores_its_cuda_generator(monkeypatch, tmp_path):
    """A sampled run on a GPU draws from the CUDA generator: a resume restores it, where it began. Through
    a double of torch.cuda's generator, since the machine may have no GPU."""
    from drafter_lab.data.regenerate import _rng_state, _set_rng_state
    from drafter_lab.errors import LabError

    gpu, held = torch.device("cuda", 0), {}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: held[device].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: held.update({device: state.clone()}))
    held[gpu] = torch.arange(16, dtype=torch.uint8)
    state = _rng_state(gpu)
    assert set(state) == {"cpu", "cuda"} and set(_rng_state(torch.device("cpu"))) == {"cpu"}
    held[gpu] = torch.zeros(16, dtype=torch.uint8)
    with torch.random.fork_rng(devices=[]):  # it also sets the CPU's generator: the other tests' is kept
        _set_rng_state(state, gpu, tmp_path / "journal")
    assert torch.equal(held[gpu], torch.arange(16, dtype=torch.uint8))
    with pytest.raises(LabError, match="began on cuda"):
        _set_rng_state(state, torch.device("cpu"), tmp_path / "journal")
