"""Training-time test (TTT): the K-step unrolled loss and the per-step counts behind every metric.

Indexing (DESIGN section 3). Features at position t come from the target reading x_0..x_t:
aux_t (fc input) and final_hidden_t, whose lm_head gives the target's distribution of x_{t+1}.
At TTT step k (s = 1 + k), position t
- embeds token x_{t+s} and takes the drafter's hidden state from step k-1 (step 0: fc(aux_t)),
  at RoPE position t + k;
- predicts x_{t+s+1}; the teacher is softmax(lm_head(final_hidden_{t+s})) restricted to the draft
  vocab (renormalised); the position counts when x_{t+s+1} is a loss-masked (assistant) token;
- is dropped from the loss when the target's top-1 there is outside the draft vocab, but still
  counts (as a miss) for accuracy, which compares the draft argmax mapped through d2t with the
  target's argmax over its FULL vocab.
cond_acc_k counts only positions whose steps 0..k-1 were all right.

Sampled acceptance (validation batches that carry the target's log-partition at a temperature T):
a chain drafted at T draws step k's token from q, the drafter's top-SAMPLE_TOPK renormalised at T
(its top-1, q one-hot, as SGLang and vLLM serve), and the target accepts it with probability
a_k = sum_x min(p(x), q(x)), p the target's full-vocab distribution at T (`chain_accept_rate`). Position t's chain reaches step k with probability
prod_{j<k} a_j; the S_* columns sum that over step k's loss positions, before and after step k, so
their ratio is the sampled analogue of cond_acc_k (at T -> 0 it is cond_acc_k).

Replay (`replay=True`, on held-out sequences of the target's own sampled tokens, `data prepare
--token-exact`): the served process itself, run over those tokens. A cycle rooted at t (tokens up to
x_{t+1} known) has its step-k draft accepted, given that x_{t+k+2} came out, with probability
r_k = min(p, q)(x_{t+k+2}) / p(x_{t+k+2}) (exact for lossless rejection sampling); j accepted drafts
and the target's own token make the next root t + j + 1. `replay_roots` carries each position's
probability of being a root through every assistant span, so the R_* columns count, per depth,
the tokens the verify steps emitted and the expected number of verify steps: the positions a
chain averages over are weighted as serving visits them (cycles start after rejections).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from drafter_lab.drafter.config import SAMPLE_TOPK
from drafter_lab.drafter.model import Eagle3Drafter, upcast
from drafter_lab.targets.hf import LogitMap
from drafter_lab.train.data import Batch

# Per-step count columns; metrics are ratios of sums, so they add up exactly over batches/ranks.
# R_TOK and R_CYC: row k counts a chain of k + 1 steps.
N_VALID, N_LOSS, CE_SUM, N_CORRECT, COND_DEN, COND_NUM, S_DEN, S_NUM, R_TOK, R_CYC = range(10)
N_COLS = 10


def proposal(logits: torch.Tensor, target_logits: torch.Tensor, logz: torch.Tensor, temperature: float):
    """(idx, q, p) of a sampled chain's draft: the drafter's top-SAMPLE_TOPK draft-vocab indices, q
    renormalised there at the temperature, and the target's full-vocab p at the same tokens.

    logits: the drafter's [M, N] over the draft vocab; target_logits: the target's [M, N] on the same
    draft-vocab tokens; logz: [M] logsumexp of the target's full-vocab logits / temperature. q lives
    on the top-SAMPLE_TOPK, so p is only needed there.
    """
    top, idx = logits.topk(min(SAMPLE_TOPK, logits.shape[-1]), -1)
    q = torch.softmax(top / temperature, -1)
    return idx, q, torch.exp(target_logits.gather(-1, idx) / temperature - logz[:, None])


def chain_accept_rate(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Per row, the probability that the draft is accepted: sum_x min(p(x), q(x)) (`proposal`'s q, p)."""
    return torch.minimum(p, q).sum(-1)


def realized_accept_rate(idx: torch.Tensor, q: torch.Tensor, p: torch.Tensor, realized: torch.Tensor,
                         used: torch.Tensor) -> torch.Tensor:
    """Per row, the probability that the draft was accepted given that the target's sampled token
    was `realized` (target ids, [M]): min(p, q)(x) / p(x), 0 when x is outside the drafter's top-K.

    `used` maps draft-vocab index to target id; idx, q, p are `proposal`'s.
    """
    hit = used[idx] == realized[:, None]
    rate = torch.where(hit, torch.minimum(p, q) / p.clamp_min(torch.finfo(p.dtype).tiny), 0.0)
    return rate.sum(-1).clamp_max(1.0)  # at most one hit; min(p, q) / p <= 1 up to rounding


def _replay_chain(rates: torch.Tensor, loss_mask: torch.Tensor):
    """(active, start, leave) of `replay_roots`: active [B, T], x_{t+1} in a span and not its end;
    start [B, T], a span's first root; leave [K, B, T, K + 1], entry j the probability that a
    depth-(d+1) cycle rooted at t accepts exactly j drafts (its next root t + j + 1)."""
    K, B, T = rates.shape
    m = loss_mask.double()
    m[:, 0] = 0  # a sequence's first token is never generated: no root precedes it
    active = torch.zeros(B, T, dtype=torch.float64, device=rates.device)
    active[:, :T - 2] = m[:, 1:T - 1] * m[:, 2:]
    start = torch.zeros_like(active)
    start[:, :T - 1] = m[:, 1:] * (1 - m[:, :-1])
    reach = torch.cat([torch.ones_like(rates[:1]), rates.cumprod(0)])  # reach[j]: drafts 0..j-1 accepted
    leave = torch.zeros(K, B, T, K + 1, dtype=torch.float64, device=rates.device)
    for d in range(K):
        leave[d, ..., :d + 1] = (reach[:d + 1] * (1 - rates[:d + 1])).permute(1, 2, 0)
        leave[d, ..., d + 1] = reach[d + 1]
    return active, start, leave


def replay_roots(rates: torch.Tensor, loss_mask: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens emitted, expected verify steps), each [K]: entry d for a chain of d + 1 steps.

    rates: [K, B, T] float64, r_k at each root (0 where step k's token is past its span); a span's
    first root is the position before its first token (the token prefill emits), and generation
    ends at its last token.

    A root's probability is start + the mass every earlier root within K + 1 passes on: a banded
    unit-lower-triangular system per chain, solved `block` positions at a time (a batched triangular
    solve each, the block's previous K + 1 roots already final), so the op count scales with
    T / block, not T as in `replay_roots_reference`'s loop (on a GPU, launches). Memory: K + 1
    doubles per rate, and one block's band.
    """
    K, B, T = rates.shape
    active, start, leave = _replay_chain(rates, loss_mask)
    J, L = K + 1, block
    n = -(-T // L)
    W, N = J + L, J + n * L
    # c[..., J + t, j]: minus the mass the root at t passes to t + j + 1 (zero rows before t = 0 and
    # past T); negated, so that the band below is the solve's strictly lower part as it stands.
    c = torch.zeros(K, B, N, J, dtype=torch.float64, device=rates.device)
    torch.mul(leave, active[..., None], out=c[:, :, J:J + T]).neg_()
    # r[chain, p, k]: what position p receives from the root at p - J + k (c's row p + k, column
    # J - 1 - k): an anti-diagonal of c, read in place.
    r = c.as_strided((K * B, n * L, J), (N * J, J, J - 1), J - 1)
    x = torch.zeros(K * B, N, 1, dtype=torch.float64, device=rates.device)
    x[:, J:J + T, 0] = start.expand(K, B, T).reshape(K * B, T)
    for b in range(n):
        p = J + b * L
        # Row i of the block's band holds r[p + i] at columns i..i + J - 1 of x[p - J:p + L]: r's rows
        # padded to W and read W - 1 apart (a row's padding is the next row's zeros before its band).
        band = F.pad(r[:, b * L:(b + 1) * L], (0, L)).as_strided((K * B, L, W), (L * W, W - 1, 1))
        rhs = torch.baddbmm(x[:, p:p + L], band[..., :J], x[:, p - J:p], alpha=-1)
        x[:, p:p + L] = torch.linalg.solve_triangular(band[..., J:], rhs, upper=False, unitriangular=True)
    return active.sum().expand(K), (x[:, J:J + T, 0].view(K, B, T) * active).sum((1, 2))


def replay_roots_reference(rates: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`replay_roots` position by position: each root, once final, passes its mass on."""
    K, B, T = rates.shape
    active, start, leave = _replay_chain(rates, loss_mask)
    roots = torch.zeros(K, B, T + K + 1, dtype=torch.float64, device=rates.device)
    roots[:, :, :T] = start
    for t in active.any(0).nonzero().flatten().tolist():
        roots[:, :, t + 1:t + K + 2] += (roots[:, :, t] * active[:, t])[..., None] * leave[:, :, t]
    return active.sum().expand(K), (roots[:, :, :T] * active).sum((1, 2))


def step_masks(batch: Batch, t2d: torch.Tensor, K: int):
    """valid[k]: position t's step-k prediction is a loss token; in_vocab[k]: its teacher top-1 is drafted.

    Both [K, B, T] bool, False where t + k + 2 runs past the sequence.
    """
    B, T = batch.input_ids.shape
    valid = torch.zeros(K, B, T, dtype=torch.bool, device=batch.input_ids.device)
    in_vocab = torch.zeros_like(valid)
    top_in = t2d[batch.top1]
    for k in range(K):
        s = 1 + k
        n = T - s - 1
        if n <= 0:
            continue
        valid[k, :, :n] = batch.loss_mask[:, s + 1:]
        in_vocab[k, :, :n] = top_in[:, s:s + n]
    return valid, in_vocab


def loss_denominators(valid: torch.Tensor, in_vocab: torch.Tensor) -> torch.Tensor:
    """Positions in each step's loss, [K] float (all-reduced over ranks before the loss)."""
    return (valid & in_vocab).flatten(1).sum(-1).float()


class TTTObjective(nn.Module):
    """The drafter plus the frozen teacher head: forward(batch) -> (loss, counts [K, N_COLS]).

    A module (not a function) so that DistributedDataParallel can wrap it.
    """

    def __init__(self, drafter: Eagle3Drafter, teacher_head: torch.Tensor, ttt_steps: int, loss_decay: float,
                 temperature: float = 0.0, replay: bool = False, logit_map: LogitMap = LogitMap()):
        super().__init__()
        self.drafter = drafter
        self.teacher_head = teacher_head  # [N, H_t] target lm_head rows of the draft vocab (not a buffer)
        self.ttt_steps = ttt_steps
        self.loss_decay = loss_decay
        self.temperature = temperature  # of the sampled acceptance, in batches that carry logz
        self.replay = replay  # those batches hold the target's own sampled tokens: replay the served process
        self.logit_map = logit_map  # the target's own scaling or capping of its logits (targets.hf.LogitMap)

    def forward(self, batch: Batch, denominators: torch.Tensor | None = None, scale: float = 1.0):
        d = self.drafter
        K = self.ttt_steps
        B, T = batch.input_ids.shape
        dev = batch.input_ids.device
        used = torch.arange(d.config.draft_vocab_size, device=dev) + d.d2t
        valid, in_vocab = step_masks(batch, d.t2d, K)
        if denominators is None:
            denominators = loss_denominators(valid, in_vocab)
        # Positions needed at step k: those whose step k or any later step is a loss position
        # (later steps' cond_acc needs step k's correctness there).
        need = valid.flip(0).cummax(0).values.flip(0)
        # In fp32 under bf16 autocast: the sampled acceptance sets these against logz, taken in fp32 over
        # the whole vocabulary (bf16 logits put p = exp(l/T - logz) off by up to 96 %, and sum past 1).
        with torch.no_grad(), torch.autocast(dev.type, enabled=False):
            raw = upcast(batch.final_hidden @ self.teacher_head.to(batch.final_hidden).T)
            target_logits = self.logit_map(raw, used)  # the draft vocabulary's rows: their bias; padded ones masked
            teacher = torch.log_softmax(target_logits, -1)
        hidden = d.project(batch.aux_hidden)
        positions = torch.arange(T, device=dev).expand(B, T)
        cache: list = []
        prev_ok = torch.ones(B, T, dtype=torch.bool, device=dev)
        sampled = batch.logz is not None
        reach = torch.ones(B, T, dtype=torch.float64, device=dev) if sampled else None  # P(t's chain gets to step k)
        replay = torch.zeros(K, B, T, dtype=torch.float64, device=dev) if sampled and self.replay else None
        counts = torch.zeros(K, N_COLS, dtype=torch.float64, device=dev)
        loss = upcast(hidden.new_zeros(()))
        for k in range(K):
            s = 1 + k
            tokens = torch.zeros_like(batch.input_ids)
            tokens[:, :T - s] = batch.input_ids[:, s:]
            hidden = d.ttt_step(d.embed(tokens), hidden, positions + k, cache)
            n = T - s - 1
            if n <= 0:
                break
            sel = need[k, :, :n]
            logits = upcast(d.logits(hidden[:, :n][sel]))  # [M, N]
            v = valid[k, :, :n][sel]
            inv = in_vocab[k, :, :n][sel]
            logq = torch.log_softmax(logits, -1)
            t_logp = teacher[:, s:s + n][sel]
            ce = -(t_logp.exp() * logq).sum(-1)
            in_loss = v & inv
            ce_sum = ce[in_loss].sum()
            loss = loss + (self.loss_decay ** k) * ce_sum / denominators[k].clamp_min(1) * scale
            with torch.no_grad():
                correct = used[logits.argmax(-1)] == batch.top1[:, s:s + n][sel]
                prev = prev_ok[:, :n][sel]
                counts[k, N_VALID] = v.sum()
                counts[k, N_LOSS] = in_loss.sum()
                counts[k, CE_SUM] = ce_sum.detach().double()
                counts[k, N_CORRECT] = (correct & v).sum()
                counts[k, COND_DEN] = (prev & v).sum()
                counts[k, COND_NUM] = (prev & v & correct).sum()
                ok = torch.zeros_like(prev_ok)
                ok[:, :n][sel] = correct
                prev_ok = prev_ok & ok
                if sampled:
                    idx, q, p = proposal(logits, target_logits[:, s:s + n][sel], batch.logz[:, s:s + n][sel],
                                         self.temperature)
                    rate = torch.zeros_like(reach)
                    rate[:, :n][sel] = chain_accept_rate(q, p).double()
                    counts[k, S_DEN] = reach[:, :n][sel][v].sum()
                    reach = reach * rate
                    counts[k, S_NUM] = reach[:, :n][sel][v].sum()
                if replay is not None:
                    replay[k, :, :n][sel] = realized_accept_rate(idx, q, p, batch.input_ids[:, s + 1:][sel],
                                                                 used).double() * v
        if replay is not None:
            counts[:, R_TOK], counts[:, R_CYC] = replay_roots(replay, batch.loss_mask)
        return loss, counts

