"""Targets and drafters for the speculative-decoding tests.

`trained_drafter` is made good on purpose (but not perfect): trained for a moment with `ttt_step` on the
target's own greedy continuations of the test prompts, so that decoding accepts several tokens per
step and also rejects some (rollback is exercised). It uses a reduced draft vocabulary, so d2t
mapping is exercised too.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from drafter_lab.data.conversations import Conversation
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.eval import render_prompts
from drafter_lab.targets.hf import default_aux_layer_ids, load_target

PROMPT_TEXTS = [
    "def foo(x):\n    return",
    "import os\nimport sys\n\nclass Parser",
    "for i in range(10):",
    "# a comment about",
    "x = [1, 2, 3]\n",
    "while True:\n    pass",
]


@contextlib.contextmanager
def one_thread():
    """Tiny models: a second intra-op thread only adds barrier waits, badly so on a loaded CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def target(random_llama):
    return load_target(random_llama)


@pytest.fixture(scope="session")
def conversations():
    return [
        Conversation(id=f"c{i}", messages=[{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}])
        for i, t in enumerate(PROMPT_TEXTS)
    ]


@pytest.fixture(scope="session")
def prompts(target, conversations):
    """The eval prompts: chat template + generation prompt."""
    return render_prompts(target.tokenizer, conversations)


def make_drafter(target, used: torch.Tensor | None = None, seed: int = 0) -> Eagle3Drafter:
    """A randomly initialised drafter for `target`; `used` = draft vocab (sorted target ids)."""
    used = torch.arange(target.vocab_size) if used is None else used
    cfg = DrafterConfig.for_target(target.config, len(used), default_aux_layer_ids(target.num_layers))
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg)
    with torch.no_grad():
        d.embed_tokens.weight.copy_(target.embed_weight())
        d.d2t.copy_(used - torch.arange(len(used)))
        d.t2d.zero_()
        d.t2d[used] = True
    return d.eval()


@pytest.fixture(scope="session")
def random_drafter(target):
    gen = torch.Generator().manual_seed(3)
    used = torch.sort(torch.randperm(target.vocab_size, generator=gen)[:200]).values
    return make_drafter(target, used, seed=1)


def greedy_continuations(target, prompts, new_tokens=40) -> list[list[int]]:
    engine = SpecEngine(target, None, SpecConfig(max_new_tokens=new_tokens, stop_at_eos=False))
    return [p + o for p, o in zip(prompts, engine.generate(prompts, speculative=False).tokens)]


def train_on(target, drafter, seqs, iters=30, ttt_steps=3):
    """Teacher-forced TTT (hard labels, draft vocab) on token sequences of the target."""
    L = min(len(s) for s in seqs)
    x = torch.tensor([s[:L] for s in seqs])
    with torch.no_grad():
        hs = target.model(x, output_hidden_states=True).hidden_states
    aux = torch.cat([hs[i] for i in drafter.config.aux_layer_ids], -1)
    to_draft = torch.full((target.vocab_size,), -100, dtype=torch.long)
    used = torch.arange(drafter.config.draft_vocab_size) + drafter.d2t
    to_draft[used] = torch.arange(len(used))
    n = L - ttt_steps - 1
    pos = torch.arange(n)[None].expand(x.shape[0], n)
    drafter.train()
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(iters):
        cache, loss = [], 0.0
        h = drafter.project(aux[:, :n])
        for k in range(ttt_steps):
            h = drafter.ttt_step(drafter.embed(x[:, 1 + k: 1 + k + n]), h, pos + k, cache)
            logits = drafter.logits(h)
            labels = to_draft[x[:, 2 + k: 2 + k + n]]
            loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


@pytest.fixture(scope="session")
def trained_drafter(target, prompts):
    with one_thread():
        seqs = greedy_continuations(target, prompts)
    seen = sorted({t for s in seqs for t in s})
    fill = [i for i in range(target.vocab_size) if i not in set(seen)][: max(0, 300 - len(seen))]
    used = torch.tensor(sorted(seen + fill))
    with one_thread():
        return train_on(target, make_drafter(target, used, seed=2), seqs)


@pytest.fixture(scope="session")
def drafter_dir(tmp_path_factory, trained_drafter):
    return save_drafter(trained_drafter, tmp_path_factory.mktemp("drafter") / "ckpt")


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory, conversations):
    f = tmp_path_factory.mktemp("prompts") / "eval.jsonl"
    f.write_text("".join(json.dumps({"id": c.id, "conversations": c.messages}) + "\n" for c in conversations))
    return f


def late_tokens(outputs: list[list[int]], first: int, n: int = 2) -> set[int]:
    """Tokens that, as eos, end some rows early but none within its first `first` tokens."""
    early = {t for row in outputs for t in row[:first]}
    picks: set[int] = set()
    for row in outputs:
        picks |= set([t for t in row[first:] if t not in early][:1])
        if len(picks) == n:
            break
    return picks
