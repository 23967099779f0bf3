"""The drafter side of speculative decoding: its KV cache, the extend pass, chain and tree drafting.

Drafter cache entry t holds position t's step-0 input (embed(x_{t+1}), fc(aux_t)), so a row's
committed drafter length equals its committed target length. After each verify the drafter
*extends* over the accepted positions (the root and the accepted drafts, each paired with the
next emitted token); the last of them is draft step 0. Draft steps k = 1..S-1 then feed the
drafter's own pre-norm hidden state and the token drafted at step k-1, at RoPE position t+k,
writing their cache entries right after the committed ones. Those entries are speculative:
rollback is just not advancing `lens`, and the next extend overwrites them.

Tree drafting (EAGLE-2 style) keeps a beam of `topk` nodes per depth, each a row with its own
copy of the cache (the reference `draft_step` attends to a contiguous prefix), expands every beam
node to its top-k children, keeps the top-k children by cumulative log-prob as the next beam, and
finally verifies the `draft_tokens` best nodes over all depths.
"""

from __future__ import annotations

import functools

import torch

from drafter_lab.kernels import draft_step as fused_op
from drafter_lab.spec.sampling import probs_from_logits, scatter_dist
from drafter_lab.spec.tree import Candidates, DraftTree, chain


def resolve_step(drafter, use_fused: bool | None):
    """The draft-step function and whether it may run the fused op.

    use_fused=None: the fused op when it is built for CUDA, the drafter is on CUDA and the kernels
    implement it (`op_takes`; the face checks each call's tensors too), else the reference
    `Eagle3Drafter.draft_step`; True forces the op (an error when it is not built), False forces
    the reference.
    """
    if use_fused is False:
        return drafter.draft_step, False
    device = drafter.fc.weight.device
    if use_fused is None and not (device.type == "cuda" and fused_op.available(device)
                                  and fused_op.op_takes(drafter.config)):
        return drafter.draft_step, False
    return functools.partial(fused_op.draft_step, drafter, use_fused=use_fused), True


def _nan_last(logp: torch.Tensor) -> torch.Tensor:
    """NaN log-probs (a beam node's step that overflowed, e.g. an fp16 drafter's residual stream) as -inf:
    torch ranks NaN above every number, so its children took the beam and were verified without it.
    (A step's log-probs are all NaN or none, so a NaN step 0 leaves a whole row tied, in creation order.)"""
    return logp.masked_fill(logp.isnan(), float("-inf"))


class DrafterRunner:
    def __init__(self, drafter, use_fused: bool | None = None):
        self.drafter = drafter
        self.step, self.fused = resolve_step(drafter, use_fused)
        self.k = self.v = self.lens = None

    def reset(self, batch: int, max_len: int, device) -> None:
        self.k, self.v = self.drafter.new_kv_cache(batch, max_len)
        self.lens = torch.zeros(batch, dtype=torch.long, device=device)

    def join(self, next_ids: torch.Tensor, aux: torch.Tensor, lens: torch.Tensor, topk: int, max_len: int,
             append: bool = True):
        """Continuous batching: prefill new rows (`extend` over their prompts, into caches of
        `max_len`) and append them to the batch's rows (with `append`; else they are the batch).
        Returns the new rows' step 0."""
        old = (self.k, self.v, self.lens)
        self.reset(len(lens), max_len, next_ids.device)
        step0 = self.extend(next_ids, aux, lens, topk)
        if append:
            self.k, self.v, self.lens = (torch.cat(pair) for pair in zip(old, (self.k, self.v, self.lens)))
        return step0

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows (indices, in this order) stay in the batch."""
        self.k, self.v, self.lens = self.k[rows], self.v[rows], self.lens[rows]

    @torch.no_grad()
    def extend(self, next_ids: torch.Tensor, aux: torch.Tensor, counts: torch.Tensor, topk: int):
        """Commit counts[b] positions per row: next_ids [B, m] (the token after each position),
        aux [B, m, 3*H_t]. Same math as `draft_step`, for m queries at once. Returns the last
        committed position's (hidden [B, H], top-k target ids [B, k], log-probs [B, k])."""
        d = self.drafter
        layer, attn = d.midlayer, d.midlayer.self_attn
        B, m = next_ids.shape
        hidden = d.project(aux)
        pos = self.lens[:, None] + torch.arange(m, device=next_ids.device)
        x, residual = layer.attn_input(d.embed(next_ids), hidden)
        q, k, v = attn.qkv(x, pos)  # [B, h, m, d]
        rows, cols = (torch.arange(m, device=pos.device)[None] < counts[:, None]).nonzero(as_tuple=True)
        slots = pos[rows, cols]
        self.k[rows, :, slots] = k[rows, :, cols].to(self.k.dtype)
        self.v[rows, :, slots] = v[rows, :, cols].to(self.v.dtype)
        S = int(pos.max()) + 1
        kk = attn.expand_kv(self.k[:, :, :S].to(q.dtype))
        # a masked probability 0 times a stale NaN (a speculative entry of a draft step that overflowed, past
        # this commit) is NaN: values past each row's commit are zeroed, as `draft_step` zeroes them
        committed = torch.arange(S, device=pos.device)[None] < (self.lens + counts)[:, None]
        vv = attn.expand_kv(self.v[:, :, :S].to(q.dtype)).masked_fill(~committed[:, None, :, None], 0)
        scores = torch.matmul(q, kk.transpose(-1, -2)) * attn.cfg.head_dim ** -0.5  # [B, h, m, S]
        allowed = torch.arange(S, device=pos.device)[None, None] <= pos[:, :, None]
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), -1).to(q.dtype)
        out = torch.matmul(probs, vv).transpose(1, 2).reshape(B, m, -1)
        h = layer.finish(residual, out)
        last = h[torch.arange(B, device=h.device), (counts - 1).clamp_min(0)]
        logp = torch.log_softmax(d.logits(last).float(), -1)
        top_logp, top = logp.topk(topk, -1)
        self.lens = self.lens + counts
        return last, d.to_target_ids(top), top_logp

    def _reachable(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the cache slots a cycle of `steps` draft steps can reach (written through)."""
        S = int(self.lens.max()) + steps
        return self.k[:, :, :S], self.v[:, :, :S]

    def _chain_caches(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The caches a chain drafts into. The fused op takes them whole (contiguous) and reads each
        row's own length; the reference attends to every slot it is given, so it gets the reachable."""
        return (self.k, self.v) if self.fused else self._reachable(steps)

    @torch.no_grad()
    def draft_tree(self, root, h0, ids0, logp0, steps: int, topk: int, draft_tokens: int) -> DraftTree:
        """Greedy tree drafting: S draft steps from step 0's (h0, ids0, logp0). A chain gives the same
        tree with topk 1, but `draft_chain` drafts it without the beam and candidate bookkeeping."""
        d = self.drafter
        B, K = root.shape[0], topk
        dev = root.device
        cands = Candidates()
        beam_tok, beam_score = ids0[:, :K], logp0[:, :K]
        beam_idx = cands.add(beam_tok, beam_score, torch.full_like(beam_tok, -1), depth=1).expand(B, K)
        hidden = h0.repeat_interleave(K, 0)
        base = self.lens.repeat_interleave(K)
        kc, vc = (t.repeat_interleave(K, 0) for t in self._reachable(steps))  # a copy per beam node
        row0 = torch.arange(B, device=dev)[:, None] * K
        for depth in range(1, steps):
            pos = base + depth - 1
            h, ids, lp = self.step(d.embed(beam_tok.reshape(-1)), hidden, pos, kc, vc, pos, K)
            scores = (beam_score[:, :, None] + _nan_last(lp).view(B, K, K)).reshape(B, K * K)
            child_tok = ids.view(B, K * K)
            child_parent = beam_idx[:, :, None].expand(B, K, K).reshape(B, K * K)
            child_idx = cands.add(child_tok, scores, child_parent, depth=depth + 1)
            if depth == steps - 1:
                break
            beam_score, pick = scores.topk(K, dim=1)
            beam_tok = child_tok.gather(1, pick)
            beam_idx = child_idx[pick]
            rows = (row0 + pick // K).reshape(-1)
            hidden = h[rows]
            kc, vc = kc[rows], vc[rows]
        return cands.select(root, draft_tokens)

    @torch.no_grad()
    def draft_chain(self, root, h0, ids0, logp0, steps: int, temperature: float = 0.0, generator=None,
                    vocab: int = 0) -> DraftTree:
        """A chain of `steps` tokens from step 0's (h0, ids0, logp0): each the drafter's top-1 at
        temperature 0, else drawn from its renormalised top-k distribution q at `temperature`, with
        q kept per node for the accept/resample test. Its speculative cache entries land past
        `lens`, and the next extend overwrites them."""
        d = self.drafter
        B, k = ids0.shape
        qs = [torch.zeros(B, vocab, device=root.device)] if temperature > 0 else None  # the root has no proposal
        toks = []
        hidden, ids, lp = h0, ids0, logp0
        caches = self._chain_caches(steps)
        for depth in range(1, steps + 1):
            if qs is None:
                tok = ids[:, 0]
            else:
                q = probs_from_logits(lp, temperature)
                # a step that overflowed (NaN log-probs; the greedy chain still drafts its top-1) proposes
                # its top-k uniformly: the accept test divides by the q it is given, so it stays lossless,
                # where multinomial raised on the NaN (at sample_topk 1, q is the same 1 either way)
                q = torch.where(q.isnan().any(-1, keepdim=True), torch.full_like(q, 1.0 / k), q)
                tok = ids.gather(1, torch.multinomial(q, 1, generator=generator))[:, 0]
                qs.append(scatter_dist(ids, q, vocab))
            toks.append(tok)
            if depth == steps:
                break
            pos = self.lens + depth - 1
            hidden, ids, lp = self.step(d.embed(tok), hidden, pos, *caches, pos, k)
        return chain(root, torch.stack(toks, 1), None if qs is None else torch.stack(qs, 1))
