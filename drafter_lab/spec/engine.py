"""Speculative decoding: an HF target verifies what our EAGLE-3 drafter proposes, batch by batch.

One cycle per batch: draft (chain or tree) -> one target pass over the tree with a tree attention
mask -> walk the tree (greedy or lossless sampling) -> commit the accepted path in both KV caches
(rolling back the rest) -> the drafter extends over the accepted positions, whose last step is the
next cycle's draft step 0. `generate(..., speculative=False)` is plain target decoding through the
same runner (a tree of just the root), the baseline that speculation is checked and timed against.
An `NgramDrafter` in place of the drafter drafts chains or trees from the tokens seen so far
instead (no drafter model, no target hidden states).

Sampling (temperature > 0) is lossless in both drafting modes: a chain draws each draft token
from the drafter's renormalised top-`sample_topk` distribution q and verifies it by speculative
sampling (accept with min(1, p/q), else resample from norm(max(p - q, 0))); a tree keeps its
deterministic top-k children and verifies them by recursive rejection with one-hot proposals.

Rows of a batch accept different lengths: each keeps its own cache length in both models. A row
that is finished (max_new_tokens or eos) stays in the batch but commits nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from drafter_lab.errors import LabError
from drafter_lab.spec.accept import greedy_walk, sampled_walk
from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.phases import PhaseClock
from drafter_lab.spec.sampling import probs_from_logits, sample
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import DraftTree, chain


@dataclass
class SpecConfig:
    """How to draft, verify and sample."""

    steps: int = 4
    """Draft depth S: drafter steps per cycle (a chain drafts S tokens)."""
    topk: int = 1
    """Children per expanded node: 1 = chain drafting, > 1 = tree drafting."""
    draft_tokens: int | None = None
    """Tree: draft tokens T verified per cycle (best by cumulative log-prob); None = steps * topk,
    capped at the number of candidates. A chain always verifies its S tokens."""
    temperature: float = 0.0
    """0 = greedy; > 0 = sampling at this temperature with lossless rejection."""
    sample_topk: int = 8
    """Sampled chains: the drafter proposes from its top-k distribution renormalised (q)."""
    use_fused: bool | None = None
    """Draft step: True = fused op, False = PyTorch reference, None = fused when built and on CUDA."""
    max_new_tokens: int = 128
    """Tokens generated per prompt."""
    stop_at_eos: bool = True
    """End a row at the target's eos token (the eos is kept in the output)."""

    def __post_init__(self):
        if self.steps < 1 or self.topk < 1 or self.max_new_tokens < 1:
            raise LabError(
                f"need steps >= 1, topk >= 1, max_new_tokens >= 1 (got {self.steps}, {self.topk}, "
                f"{self.max_new_tokens})"
            )
        if self.temperature < 0:
            raise LabError(f"temperature must be >= 0, got {self.temperature}")
        most = self.max_candidates
        if self.draft_tokens is not None and not 1 <= self.draft_tokens <= most:
            raise LabError(
                f"draft_tokens must be in 1..{most} for steps={self.steps}, topk={self.topk}, "
                f"got {self.draft_tokens}"
            )

    @property
    def max_candidates(self) -> int:
        return self.topk + (self.steps - 1) * self.topk * self.topk

    @property
    def tree_tokens(self) -> int:
        if self.topk == 1:
            return self.steps
        return self.draft_tokens or min(self.steps * self.topk, self.max_candidates)

    @property
    def sampled_chain(self) -> bool:
        return self.temperature > 0 and self.topk == 1

    @property
    def max_accept(self) -> int:
        """Most tokens one verify step can emit (deepest path + bonus)."""
        return min(self.steps, self.tree_tokens) + 1


@dataclass
class Generation:
    tokens: list[list[int]]
    """Emitted tokens per prompt (prompt excluded), at most max_new_tokens, ending at eos if any."""
    accept_lengths: list[int] = field(default_factory=list)
    """Served accept length of every (row, verify step) while the row was unfinished."""
    draft_lengths: list[int] = field(default_factory=list)
    """Draft tokens verified at each of those (row, verify step)s (0: nothing was drafted)."""
    verify_passes: int = 0
    """Batched target forward passes after prefill."""
    no_draft_passes: int = 0
    """Of those, the passes in which no unfinished row had a draft: a plain decode step (n-gram lookup
    that matched in no row; a server decodes these without speculation)."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time by phase (`phases.PhaseClock`): prefill (the prompt through the target, and the
    drafter), then per cycle draft, verify, accept (the walk, the cache commits and the host's
    bookkeeping) and extend (the drafter over the accepted tokens); they add up to the decode's."""


def eos_ids(target) -> set[int]:
    ids = set()
    for v in (getattr(target.tokenizer, "eos_token_id", None), getattr(target.config, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(i) for i in v)
    return ids


def _root_only(root: torch.Tensor) -> DraftTree:
    return chain(root, root[:, None][:, :0])


class SpecEngine:
    def __init__(self, target, drafter=None, cfg: SpecConfig | None = None):
        self.cfg = cfg or SpecConfig()
        self.ngram = drafter if isinstance(drafter, NgramDrafter) else None
        if self.ngram is not None:
            drafter = None
        aux_ids = drafter.config.aux_layer_ids if drafter is not None else []
        self.target = TargetRunner(target.model, aux_ids, target.path)
        self.drafter = DrafterRunner(drafter, self.cfg.use_fused) if drafter is not None else None
        self.eos = eos_ids(target) if self.cfg.stop_at_eos else set()
        self.vocab = target.vocab_size
        self.pad_id = getattr(target.tokenizer, "pad_token_id", None) or 0

    @property
    def fused(self) -> bool:
        return bool(self.drafter and self.drafter.fused)

    def _choose(self, logits: torch.Tensor, generator) -> torch.Tensor:
        if self.cfg.temperature == 0:
            return logits.argmax(-1)
        return sample(probs_from_logits(logits, self.cfg.temperature), generator)

    def _walk(self, tree: DraftTree, logits: torch.Tensor, generator):
        if self.cfg.temperature == 0:
            return greedy_walk(tree, logits)
        return sampled_walk(tree, probs_from_logits(logits, self.cfg.temperature), generator)

    def _step0_topk(self) -> int:
        return self.cfg.sample_topk if self.cfg.sampled_chain else self.cfg.topk

    def _draft(self, root, step0, generator, prompts, out) -> DraftTree:
        c = self.cfg
        if self.ngram is not None:
            histories = [p + o for p, o in zip(prompts, out)]
            return self.ngram.draft(root, histories, c.steps, c.topk, c.tree_tokens, self.pad_id)
        if c.sampled_chain:
            return self.drafter.draft_chain_sampled(root, *step0, c.steps, c.temperature, generator, self.vocab)
        return self.drafter.draft_tree(root, *step0, c.steps, c.topk, c.tree_tokens)

    def _done(self, out: list[int]) -> bool:
        return len(out) >= self.cfg.max_new_tokens or any(t in self.eos for t in out)

    def _trim(self, out: list[int]) -> list[int]:
        for i, t in enumerate(out):
            if t in self.eos:
                out = out[: i + 1]
                break
        return out[: self.cfg.max_new_tokens]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, speculative: bool = True, generator=None) -> Generation:
        """Decode a batch of tokenized prompts; greedy output is identical with and without speculation."""
        if speculative and self.drafter is None and self.ngram is None:
            raise LabError("speculative decoding needs a drafter")
        if any(len(p) == 0 for p in prompts):
            raise LabError("an empty prompt cannot be decoded")
        c = self.cfg
        dev = self.target.device
        clock = PhaseClock(dev)
        B = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=dev)
        ids = torch.full((B, int(lens.max())), self.pad_id, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p, device=dev)
        rows = torch.arange(B, device=dev)

        eagle = speculative and self.drafter is not None  # drafts from the target's hidden states
        logits, aux = self.target.prefill(ids, lens, aux=eagle)
        root = self._choose(logits, generator)
        out = [[t] for t in root.tolist()]
        done = [self._done(o) for o in out]
        gen = Generation(tokens=out)
        step0 = None  # the drafter's step 0 of the next cycle (EAGLE-3)
        if speculative and self.ngram is not None:
            self.ngram.reset(B)
        if eagle:
            self.drafter.reset(B, int(lens.max()) + c.max_new_tokens + 2 * (c.steps + 1), dev)
            nxt = torch.roll(ids, -1, 1)
            nxt[rows, lens - 1] = root
            step0 = self.drafter.extend(nxt, aux, lens, self._step0_topk())
        clock.mark("prefill")

        while not all(done):
            live = torch.tensor([not d for d in done], device=dev)
            if speculative:
                tree = self._draft(root, step0, generator, prompts, out)
                clock.mark("draft")
            else:
                tree = _root_only(root)
            logits, aux = self.target.verify(tree.tokens, tree.depth, tree.ancestors(), aux=eagle)
            clock.mark("verify")
            path, counts, bonus = self._walk(tree, logits, generator)
            counts = torch.where(live, counts, torch.zeros_like(counts))
            self.target.commit(path, counts, tree.size)
            gen.verify_passes += 1

            toks = tree.tokens.gather(1, path.clamp_min(0))  # toks[:, 0] is the root, already emitted
            nxt = torch.roll(toks, -1, 1)
            nxt[rows, (counts - 1).clamp_min(0)] = bonus
            drafted = tree.drafted().tolist() if speculative else None
            if drafted is not None and not any(d for d, finished in zip(drafted, done) if not finished):
                gen.no_draft_passes += 1
            for b, (n, row) in enumerate(zip(counts.tolist(), nxt.tolist())):
                if done[b]:
                    continue
                gen.accept_lengths.append(n)
                if drafted is not None:
                    gen.draft_lengths.append(drafted[b])
                out[b].extend(row[:n])
                done[b] = self._done(out[b])
            clock.mark("accept")
            if eagle:
                aux_path = aux.gather(1, path.clamp_min(0)[..., None].expand(-1, -1, aux.shape[-1]))
                step0 = self.drafter.extend(nxt, aux_path, counts, self._step0_topk())
                clock.mark("extend")
            root = bonus
        gen.tokens = [self._trim(o) for o in out]
        if speculative and self.ngram is not None:
            self.ngram.finish([p + o for p, o in zip(prompts, gen.tokens)])
        clock.mark("accept")
        gen.phase_seconds = clock.seconds()
        return gen
