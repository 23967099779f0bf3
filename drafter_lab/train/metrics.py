"""Metrics from TTT counts (loss_k, acc_k, cond_acc_k, simulated accept length; at a temperature
sampled_acc_k and sampled_accept_len, and on the target's own tokens replay_accept_len_k) and `evaluate`.

Counts are sums (see ttt.py's columns), so metrics over many batches or ranks are exact ratios of
sums, not averages of per-batch ratios.
"""

from __future__ import annotations

import contextlib
import math

import torch

from drafter_lab.data.shards import Sequence, SequenceRef
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import LogitMap
from drafter_lab.train import distributed
from drafter_lab.train.data import Examples, collate
from drafter_lab.train.ttt import (
    CE_SUM,
    COND_DEN,
    COND_NUM,
    N_COLS,
    N_CORRECT,
    N_LOSS,
    N_VALID,
    R_CYC,
    R_TOK,
    S_DEN,
    S_NUM,
    TTTObjective,
)


def _chained(c: torch.Tensor, num: int, den: int, name: str, total: str) -> dict:
    """Per step the ratio num/den (`name`_k), and `total` = sum_k prod_{j<=k} of them: the accept
    length of a K-step chain whose step k passes with that conditional probability."""
    out: dict = {}
    accept, chain = 0.0, 1.0
    for k in range(c.shape[0]):
        cond = float(c[k, num] / c[k, den]) if c[k, den] > 0 else 0.0
        out[f"{name}_{k}"] = cond
        chain *= cond
        accept += chain
    out[total] = accept
    return out


def summarize(counts: torch.Tensor, sampled: bool = False, replay: bool = False) -> dict:
    """loss_k, acc_k, cond_acc_k and simulated_accept_len from summed counts [K, N_COLS]; `sampled`
    (a validation at a temperature): also sampled_acc_k and sampled_accept_len (ttt.py's S_* columns);
    `replay`: also replay_accept_len_k, the tokens per verify step (bonus included, as `eval` counts
    them) of a (k + 1)-step sampled chain replayed over the target's own tokens, and
    replay_accept_len, the same at K steps."""
    c = counts.double().cpu()
    out: dict = {}
    for k in range(c.shape[0]):
        out[f"loss_{k}"] = float(c[k, CE_SUM] / c[k, N_LOSS]) if c[k, N_LOSS] > 0 else float("nan")
        out[f"acc_{k}"] = float(c[k, N_CORRECT] / c[k, N_VALID]) if c[k, N_VALID] > 0 else 0.0
    out.update(_chained(c, COND_NUM, COND_DEN, "cond_acc", "simulated_accept_len"))
    if sampled:
        out.update(_chained(c, S_NUM, S_DEN, "sampled_acc", "sampled_accept_len"))
    if replay:
        for k in range(c.shape[0]):
            out[f"replay_accept_len_{k}"] = float(c[k, R_TOK] / c[k, R_CYC]) if c[k, R_CYC] > 0 else 0.0
        out["replay_accept_len"] = out[f"replay_accept_len_{c.shape[0] - 1}"]
    out["positions"] = int(c[0, N_VALID])
    return out


def weighted_loss(metrics: dict, ttt_steps: int, decay: float) -> float:
    """sum_k decay**k * loss_k over the steps that scored a position: the TTT objective's value, where a
    step without one adds nothing (its denominator clamps at 1). NaN only where no step scored one: a
    set too short for the last steps still has a weighted loss for keep_best and the watch to compare."""
    losses = [decay ** k * metrics[f"loss_{k}"] for k in range(ttt_steps) if not math.isnan(metrics[f"loss_{k}"])]
    return sum(losses) if losses else math.nan


def metric_names(ttt_steps: int, sampled: bool = False, replay: bool = False) -> list[str]:
    """The float metrics of a validation line in metrics.jsonl."""
    names = summarize(torch.zeros(ttt_steps, N_COLS), sampled, replay)
    return [k for k, v in names.items() if isinstance(v, float)] + ["weighted_loss"]


@torch.no_grad()
def eval_counts(obj: TTTObjective, examples: Examples, batch_size: int, d, autocast) -> torch.Tensor:
    """Summed counts over `examples` (sharded over ranks, then all-reduced)."""
    order = sorted(range(len(examples)), key=lambda i: examples.lengths[i])
    mine = order[d.rank::d.world]
    counts = torch.zeros(obj.ttt_steps, N_COLS, dtype=torch.float64, device=d.device)
    for a in range(0, len(mine), batch_size):
        batch = collate(examples.take(mine[a:a + batch_size])).to(d.device)
        with autocast:
            counts += obj(batch)[1]
    return d.sum(counts)


def evaluate(drafter: Eagle3Drafter, lm_head_weight: torch.Tensor, sequences: list[Sequence] | list[SequenceRef],
             ttt_steps: int, batch_size: int = 16, max_length: int | None = None, temperature: float = 0.0,
             replay: bool = False, logit_map: LogitMap = LogitMap()) -> dict:
    """Teacher-forced loss_k, acc_k, cond_acc_k and simulated accept length on `sequences` (in memory,
    or `FeatureSet.index` refs, read a batch at a time); at `temperature` > 0 also a sampled chain's
    sampled_acc_k and sampled_accept_len there, and with `replay` (sequences of the target's own
    tokens sampled at that temperature) replay_accept_len_k.

    `lm_head_weight` is the target's full lm_head [V, H_t]; the drafter's d2t/t2d give its vocab;
    `logit_map` the target's own map of the head's product to its logits (`Target.logit_map`).
    """
    # a temperature below 0 would read as greedy and a max_length of 0 as the default: say so instead
    if not math.isfinite(temperature) or temperature < 0:
        raise LabError(f"the temperature must be a finite number >= 0, got {temperature}")
    if max_length is not None and max_length < 1:
        raise LabError(f"max_length must be at least 1, got {max_length}")
    device = drafter.fc.weight.device
    used = (torch.arange(drafter.config.draft_vocab_size) + drafter.d2t.cpu()).long()
    head = lm_head_weight.detach().to(device=device, dtype=torch.float32)
    examples = Examples(sequences, lm_head_weight, max_length or drafter.config.max_position_embeddings,
                        device=device, temperature=temperature, logit_map=logit_map)
    if not examples:
        raise LabError("no sequences long enough to evaluate on")
    if replay and temperature <= 0:
        raise LabError("the replay needs the temperature the target's tokens were sampled at")
    obj = TTTObjective(drafter, head[used.to(device)], ttt_steps, 0.8, temperature, replay, logit_map)
    d = distributed.Dist(rank=0, world=1, local_rank=0, device=device)
    was_training = drafter.training
    drafter.eval()
    try:
        return summarize(eval_counts(obj, examples, batch_size, d, contextlib.nullcontext()), temperature > 0, replay)
    finally:
        drafter.train(was_training)
