"""Speculative decoding: an HF target verifies what our EAGLE-3 drafter proposes, batch by batch.

One cycle per batch: draft (chain or tree) -> one target pass over the tree with a tree attention
mask -> walk the tree (greedy or lossless sampling) -> commit the accepted path in both KV caches
(rolling back the rest) -> the drafter extends over the accepted positions, whose last step is the
next cycle's draft step 0. `generate(..., speculative=False)` is plain target decoding through the
same runner (a tree of just the root), the baseline that speculation is checked and timed against.
An `NgramDrafter` in place of the drafter drafts chains or trees from the tokens seen so far
instead (no drafter model, no target hidden states).

Sampling (temperature > 0) is lossless in both drafting modes: a chain draws each draft token
from the drafter's renormalised top-`sample_topk` distribution q (by default its top-1, q one-hot, as
SGLang and vLLM serve EAGLE) and verifies it by speculative sampling (accept with min(1, p/q), else
resample from norm(max(p - q, 0))); a tree keeps its deterministic top-k children and verifies them
by recursive rejection with one-hot proposals.

Rows of a batch accept different lengths: each keeps its own cache length in both models, and
commits what it emits (a last step cut at max_new_tokens or eos commits no more). In a static batch
a finished row stays until the last one ends, verified as its root alone and committing nothing.
With `slots` (continuous batching, as SGLang and vLLM schedule requests) it leaves at once: every
per-row state (both caches, the n-gram rows, the next root and draft step 0) keeps the other
rows, and waiting prompts are prefilled apart and appended as new rows. The caches are dense
tensors, so a row leaving or joining copies them (a server's paged cache moves nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from drafter_lab.drafter.config import SAMPLE_TOPK
from drafter_lab.errors import LabError
from drafter_lab.spec.accept import greedy_walk, sampled_walk
from drafter_lab.spec.drafting import DrafterRunner
from drafter_lab.spec.ngram import NgramDrafter
from drafter_lab.spec.phases import PhaseClock
from drafter_lab.spec.sampling import probs_from_logits, sample
from drafter_lab.spec.target import TargetRunner
from drafter_lab.spec.tree import DraftTree, chain
from drafter_lab.targets.hf import pad_token_id, stop_token_ids


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
    sample_topk: int = SAMPLE_TOPK
    """Sampled chains: the drafter proposes from its top-k distribution renormalised (q); 1, the
    engines' way, drafts its top-1 and the target accepts it with p(x)."""
    use_fused: bool | None = None
    """Draft step: True = fused op, False = PyTorch reference, None = fused when built and on CUDA."""
    max_new_tokens: int = 128
    """Tokens generated per prompt."""
    stop_at_eos: bool = True
    """End a row at the target's eos token (the eos is kept in the output)."""

    def __post_init__(self):
        for name in ("steps", "topk", "sample_topk", "max_new_tokens"):  # one each: `eval` names the one its flag set
            if getattr(self, name) < 1:
                raise LabError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.temperature < math.inf:  # nan too, which torch.multinomial meets as a traceback
            raise LabError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.topk == 1 and self.draft_tokens not in (None, self.steps):  # it was ignored, the S verified
            raise LabError(f"a chain verifies the {self.steps} tokens it drafts: draft_tokens {self.draft_tokens} "
                           "applies to a tree (topk > 1)")
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
        # a chain's draft_tokens is None (refused above); steps * topk never passes max_candidates
        return self.draft_tokens or self.steps * self.topk

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
    first_token_seconds: list[float] = field(default_factory=list)
    """Per prompt: seconds from the decode's start until its first token was out (its prefill done)."""
    finish_seconds: list[float] = field(default_factory=list)
    """Per prompt: seconds from the decode's start until its last token was out (the walk of its
    last cycle done)."""
    rows_per_pass: list[int] = field(default_factory=list)
    """Rows in the batch at each of those passes, finished ones riding along included."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    """Wall time by phase (`phases.PhaseClock`): prefill (the prompts through the target, and the
    drafter, as they join), then per cycle draft, verify, accept (the walk, the cache commits, the
    host's bookkeeping and rows leaving) and extend (the drafter over the accepted tokens); they
    add up to the decode's."""


def _root_only(root: torch.Tensor) -> DraftTree:
    return chain(root, root[:, None][:, :0])


def _finished_as_roots(tree: DraftTree, live: torch.Tensor) -> DraftTree:
    """The tree with every node of a finished row (live False) but its root made padding at depth 0: its
    drafts reach past its bound, where a learned-position target's table (GPT-2's) ends. The last nodes
    then padding in every row are dropped, a guard only: no drafter gives a finished row the widest tree
    today (its n-gram lookup is not run, and EAGLE-3 rows draft alike)."""
    own = torch.arange(tree.size, device=live.device)
    parents = torch.where(live[:, None] | (own == 0), tree.parents, own)
    n = int(torch.nonzero((parents != own).any(0)).max()) + 1  # the root is no padding
    return DraftTree(tree.tokens[:, :n], parents[:, :n], torch.where(live[:, None], tree.depth, 0)[:, :n],
                     None if tree.q is None else tree.q[:, :n])


class SpecEngine:
    def __init__(self, target, drafter=None, cfg: SpecConfig | None = None):
        self.cfg = cfg or SpecConfig()
        self.ngram = drafter if isinstance(drafter, NgramDrafter) else None
        if self.ngram is not None:
            drafter = None
        if drafter is not None and self._step0_topk() > drafter.config.draft_vocab_size:  # else topk's traceback
            name = "sample_topk" if self.cfg.sampled_chain else "topk"
            raise LabError(f"{name} {self._step0_topk()} exceeds the drafter's draft vocab of "
                           f"{drafter.config.draft_vocab_size} tokens")
        aux_ids = drafter.config.aux_layer_ids if drafter is not None else []
        self.target = TargetRunner(target.model, aux_ids, target.path)
        # None where the target's config names no limit. A drafter's own (2048 on many EAGLE-3 heads of 128k
        # targets) binds nothing: its RoPE is computed for any position, and SGLang drafts past it too.
        self.max_positions = getattr(target.config, "max_position_embeddings", None)
        self.drafter = DrafterRunner(drafter, self.cfg.use_fused) if drafter is not None else None
        self.eos = set(stop_token_ids(target)) if self.cfg.stop_at_eos else set()
        self.vocab = target.vocab_size
        self.pad_id = pad_token_id(target)

    @property
    def fused(self) -> bool:
        return bool(self.drafter and self.drafter.fused)

    def check_positions(self, prompts: list[list[int]], speculative: bool = True) -> None:
        """Refuse, before any decoding, prompts that would run past the positions the target is made for, its
        max_position_embeddings. A row's last verify step comes with at most max_new_tokens - 1 tokens emitted,
        the last of them its root at len(prompt) + max_new_tokens - 2, and its deepest draft `steps` further.
        (A finished row riding along in a static batch is verified as its root alone, at most at
        len(prompt) + max_new_tokens - 1.) Past the limit the target meets positions it was not trained
        for; a `steps` of thousands drafted for minutes, and one of 20 digits sized the drafter's cache
        into a TypeError. A max_new_tokens of 1 is the prefill's token alone: no verify step, no draft."""
        c = self.cfg
        longest = max(map(len, prompts), default=0)
        drafts = speculative and c.max_new_tokens > 1
        last = longest + c.max_new_tokens + (c.steps if drafts else 0) - 2
        if self.max_positions is not None and last >= self.max_positions:
            # each setting by its field's name first, which `eval` names by its flag (config.flags_named)
            setting = f"steps {c.steps} with max_new_tokens" if drafts else "max_new_tokens"
            raise LabError(f"{setting} {c.max_new_tokens} takes the longest prompt ({longest} tokens) to "
                           f"position {last}, past the target's max_position_embeddings {self.max_positions}")

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

    def _draft(self, root, step0, generator, histories) -> DraftTree:
        """histories: with n-gram drafting, each row's prompt and emitted tokens (None: the row is finished)."""
        c = self.cfg
        if self.ngram is not None:
            return self.ngram.draft(root, histories, c.steps, c.topk, c.tree_tokens, self.pad_id)
        if c.topk == 1:
            return self.drafter.draft_chain(root, *step0, c.steps, c.temperature, generator, self.vocab)
        return self.drafter.draft_tree(root, *step0, c.steps, c.topk, c.tree_tokens)

    def _done(self, out: list[int]) -> bool:
        return len(out) >= self.cfg.max_new_tokens or any(t in self.eos for t in out)

    def _emitted(self, out: list[int], tokens: list[int]) -> list[int]:
        """What of a verify step's `tokens` a row whose output is `out` emits: up to its first eos and
        max_new_tokens. Accept lengths count these only, as SGLang's do: a server returns no more."""
        for i, t in enumerate(tokens):
            if t in self.eos:
                tokens = tokens[: i + 1]
                break
        return tokens[: self.cfg.max_new_tokens - len(out)]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, speculative: bool = True, generator=None,
                 slots: int | None = None, on_finish: Callable[[int], None] | None = None,
                 on_tokens: Callable[[int, list[int]], None] | None = None) -> Generation:
        """Decode tokenized prompts; greedy output is identical with and without speculation.

        slots=None decodes them as one static batch: every row stays until the last one ends (the
        finished ones commit nothing). With `slots`, continuous batching as a server runs it: at most
        `slots` rows in flight; a finished row leaves the batch and the next waiting prompt is
        prefilled into its place before the next cycle. `on_finish(n)` is called as n finished rows
        leave the batch (a progress bar's advance). `on_tokens(i, tokens)` streams prompt i's output
        as it comes: its first token after its prefill, then each verify step's (cut at eos and
        max_new_tokens), so what it is handed adds up to the prompt's output.
        """
        if speculative and self.drafter is None and self.ngram is None:
            raise LabError("speculative decoding needs a drafter")
        if any(len(p) == 0 for p in prompts):
            raise LabError("an empty prompt cannot be decoded")
        if slots is not None and slots < 1:
            raise LabError(f"slots must be >= 1, got {slots}")
        self.check_positions(prompts, speculative)
        continuous = slots is not None
        slots = slots or len(prompts)
        clock = PhaseClock(self.target.device)
        c = self.cfg
        # Every row's drafter cache holds the longest prompt, so rows join the batch by a concat. A row commits at
        # most len(prompt) + max_new_tokens - 1 slots (all it emits but the next root); an extend spans steps + 1
        # past every row's length, a finished row's riding along in a static batch too.
        batch = _Batch(eagle=speculative and self.drafter is not None, ngram=speculative and self.ngram is not None,
                       drafter_len=max(map(len, prompts), default=0) + c.max_new_tokens + c.steps)
        if batch.ngram:
            self.ngram.reset(0)
        out: list[list[int]] = [[] for _ in prompts]
        gen = Generation(tokens=out)
        waiting = list(range(len(prompts)))
        first_mark, last_mark = [0] * len(prompts), [0] * len(prompts)  # clock marks of each prompt's first, last token
        streamed = [0] * len(prompts)  # tokens of each prompt handed to on_tokens

        def stream(indices: list[int]) -> None:
            for i in indices:
                new = out[i][streamed[i]:]
                if new:
                    streamed[i] += len(new)
                    on_tokens(i, new)

        while True:
            finished = [b for b, done in enumerate(batch.done) if done]
            if finished and (continuous or len(finished) == len(batch.rows)):
                self._leave(batch, finished, prompts, out)
                if on_finish is not None:
                    on_finish(len(finished))
                clock.mark("accept")
            if waiting and len(batch.rows) < slots:
                joining, waiting = waiting[: slots - len(batch.rows)], waiting[slots - len(batch.rows):]
                self._join(batch, joining, prompts, out, generator)
                if on_tokens is not None:
                    stream(joining)
                for i in joining:
                    first_mark[i] = last_mark[i] = len(clock.marks)
                clock.mark("prefill")
                continue  # a prompt may be done at its first token
            if not batch.rows:
                break
            emitting = [i for i, done in zip(batch.rows, batch.done) if not done] if on_tokens is not None else []
            ended, at = self._cycle(batch, prompts, out, gen, speculative, generator, clock)
            for i in ended:
                last_mark[i] = at
            if on_tokens is not None:
                stream(emitting)
                clock.mark("accept")
        gen.phase_seconds = clock.seconds()
        times = clock.elapsed()
        gen.first_token_seconds = [times[m] for m in first_mark]
        gen.finish_seconds = [times[m] for m in last_mark]
        return gen

    def _join(self, batch: _Batch, joining: list[int], prompts, out, generator) -> None:
        """Prefill the joining prompts (target, then drafter) and append them as rows of the batch."""
        dev = self.target.device
        append = bool(batch.rows)  # else the runners start afresh
        lens = torch.tensor([len(prompts[i]) for i in joining], device=dev)
        ids = torch.full((len(joining), int(lens.max())), self.pad_id, dtype=torch.long, device=dev)
        for b, i in enumerate(joining):
            ids[b, : len(prompts[i])] = torch.tensor(prompts[i], device=dev)
        logits, aux = self.target.join(ids, lens, aux=batch.eagle, append=append)
        root = self._choose(logits, generator)
        for i, t in zip(joining, root.tolist()):
            out[i].append(t)
        if batch.ngram:
            self.ngram.join(len(joining))
        step0 = None
        if batch.eagle:
            nxt = torch.roll(ids, -1, 1)
            nxt[torch.arange(len(joining), device=dev), lens - 1] = root
            step0 = self.drafter.join(nxt, aux, lens, self._step0_topk(), batch.drafter_len, append)
        batch.append(joining, root, step0, [self._done(out[i]) for i in joining])

    def _leave(self, batch: _Batch, finished: list[int], prompts, out) -> None:
        """The finished rows leave the batch (n-gram drafting across prompts may look them up next)."""
        if batch.ngram:
            self.ngram.finish([prompts[batch.rows[b]] + out[batch.rows[b]] for b in finished])
        keep = torch.tensor([b for b in range(len(batch.rows)) if b not in finished], dtype=torch.long,
                            device=self.target.device)
        self.target.keep(keep)
        if batch.eagle:
            self.drafter.keep(keep)
        if batch.ngram:
            self.ngram.keep(keep.tolist())
        batch.keep(keep)

    def _cycle(self, batch: _Batch, prompts, out, gen: Generation, speculative: bool, generator,
               clock) -> tuple[list[int], int]:
        """Draft, verify, walk and commit once for every row; then extend the drafter. Returns the
        prompts that ended in this cycle and the clock mark at which their last token was out."""
        dev = self.target.device
        rows = torch.arange(len(batch.rows), device=dev)
        done = batch.done  # updated in place as rows end
        gen.rows_per_pass.append(len(batch.rows))
        if speculative:
            # a finished row's draft is dropped (`_finished_as_roots`): its n-gram lookup is not run
            histories = [None if d else prompts[i] + out[i] for i, d in zip(batch.rows, done)] if batch.ngram else None
            tree = self._draft(batch.root, batch.step0, generator, histories)
            if any(done):
                tree = _finished_as_roots(tree, torch.tensor([not d for d in done], device=dev))
            clock.mark("draft")
        else:
            tree = _root_only(batch.root)
        logits, aux = self.target.verify(tree.tokens, tree.depth, tree.ancestors(), aux=batch.eagle)
        clock.mark("verify")
        path, counts, bonus = self._walk(tree, logits, generator)
        gen.verify_passes += 1

        toks = tree.tokens.gather(1, path.clamp_min(0))  # toks[:, 0] is the root, already emitted
        nxt = torch.roll(toks, -1, 1)
        nxt[rows, counts - 1] = bonus
        drafted = tree.drafted().tolist() if speculative else None
        if drafted is not None and not any(d for d, finished in zip(drafted, done) if not finished):
            gen.no_draft_passes += 1
        ended, committed = [], [0] * len(batch.rows)
        for b, (n, row) in enumerate(zip(counts.tolist(), nxt.tolist())):
            if done[b]:
                continue
            emitted = self._emitted(out[batch.rows[b]], row[:n])
            # a row commits what it emits: the rest of a path cut at its end would take a finished row past
            # its bound (its root at len(prompt) + max_new_tokens - 1 at most)
            committed[b] = len(emitted)
            gen.accept_lengths.append(len(emitted))
            if drafted is not None:
                gen.draft_lengths.append(drafted[b])
            out[batch.rows[b]].extend(emitted)
            done[b] = self._done(out[batch.rows[b]])
            if done[b]:
                ended.append(batch.rows[b])
        counts = torch.tensor(committed, device=dev)
        self.target.commit(path, counts, tree.size)
        at = len(clock.marks)
        clock.mark("accept")
        if batch.eagle:
            aux_path = aux.gather(1, path.clamp_min(0)[..., None].expand(-1, -1, aux.shape[-1]))
            batch.step0 = self.drafter.extend(nxt, aux_path, counts, self._step0_topk())
            clock.mark("extend")
        batch.root = bonus
        return ended, at


@dataclass
class _Batch:
    """The rows in flight, each with its per-row state outside the two caches."""

    eagle: bool
    """Drafting from the target's hidden states (an EAGLE-3 drafter, speculative)."""
    ngram: bool
    """Drafting by n-gram lookup (speculative)."""
    drafter_len: int
    """Drafter cache length per row."""
    rows: list[int] = field(default_factory=list)
    """The prompt each row decodes."""
    done: list[bool] = field(default_factory=list)
    """Whether each row has ended (max_new_tokens or eos)."""
    root: torch.Tensor | None = None
    """[B]: each row's last emitted token, the root of its next draft."""
    step0: tuple[torch.Tensor, ...] | None = None
    """EAGLE-3: each row's draft step 0 of the next cycle (hidden [B, H], top-k ids, top-k log-probs)."""

    def append(self, joining: list[int], root: torch.Tensor, step0, done: list[bool]) -> None:
        self.rows = self.rows + joining
        self.done = self.done + done
        self.root = root if self.root is None else torch.cat([self.root, root])
        if step0 is not None:
            self.step0 = step0 if self.step0 is None else tuple(map(torch.cat, zip(self.step0, step0)))

    def keep(self, keep: torch.Tensor) -> None:
        kept = keep.tolist()
        self.rows = [self.rows[b] for b in kept]
        self.done = [self.done[b] for b in kept]
        self.root = self.root[keep]
        if self.step0 is not None:
            self.step0 = tuple(t[keep] for t in self.step0)
