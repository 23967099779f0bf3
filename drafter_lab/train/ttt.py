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
a chain drafted at T draws step k's token from q, the drafter's top-SAMPLE_TOPK renormalised at T,
and the target accepts it with probability a_k = sum_x min(p(x), q(x)), p the target's full-vocab
distribution at T (`chain_accept_rate`). Position t's chain reaches step k with probability
prod_{j<k} a_j; the S_* columns sum that over step k's loss positions, before and after step k, so
their ratio is the sampled analogue of cond_acc_k (at T -> 0 it is cond_acc_k).
"""

from __future__ import annotations

import torch
from torch import nn

from drafter_lab.drafter.model import Eagle3Drafter, upcast
from drafter_lab.spec.sampling import SAMPLE_TOPK
from drafter_lab.train.data import Batch

# Per-step count columns; metrics are ratios of sums, so they add up exactly over batches/ranks.
N_VALID, N_LOSS, CE_SUM, N_CORRECT, COND_DEN, COND_NUM, S_DEN, S_NUM = range(8)
N_COLS = 8


def chain_accept_rate(logits: torch.Tensor, target_logits: torch.Tensor, logz: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """Per row, the probability that a sampled chain's draft is accepted: sum_x min(p(x), q(x)).

    logits: the drafter's [M, N] over the draft vocab; target_logits: the target's [M, N] on the same
    draft-vocab tokens; logz: [M] logsumexp of the target's full-vocab logits / temperature. q lives
    on the drafter's top-SAMPLE_TOPK, so p is only needed there.
    """
    top, idx = logits.topk(min(SAMPLE_TOPK, logits.shape[-1]), -1)
    q = torch.softmax(top / temperature, -1)
    p = torch.exp(target_logits.gather(-1, idx) / temperature - logz[:, None])
    return torch.minimum(p, q).sum(-1)


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
                 temperature: float = 0.0):
        super().__init__()
        self.drafter = drafter
        self.teacher_head = teacher_head  # [N, H_t] target lm_head rows of the draft vocab (not a buffer)
        self.ttt_steps = ttt_steps
        self.loss_decay = loss_decay
        self.temperature = temperature  # of the sampled acceptance, in batches that carry logz

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
        with torch.no_grad():
            target_logits = upcast(batch.final_hidden @ self.teacher_head.to(batch.final_hidden).T)
            teacher = torch.log_softmax(target_logits, -1)
        hidden = d.project(batch.aux_hidden)
        positions = torch.arange(T, device=dev).expand(B, T)
        cache: list = []
        prev_ok = torch.ones(B, T, dtype=torch.bool, device=dev)
        sampled = batch.logz is not None
        reach = torch.ones(B, T, dtype=torch.float64, device=dev) if sampled else None  # P(t's chain gets to step k)
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
                    rate = torch.zeros_like(reach)
                    rate[:, :n][sel] = chain_accept_rate(logits, target_logits[:, s:s + n][sel],
                                                         batch.logz[:, s:s + n][sel], self.temperature).double()
                    counts[k, S_DEN] = reach[:, :n][sel][v].sum()
                    reach = reach * rate
                    counts[k, S_NUM] = reach[:, :n][sel][v].sum()
        return loss, counts

