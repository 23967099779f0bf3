"""TrainConfig: every knob of a drafter training run (TOML loadable, CLI overridable)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from drafter_lab.config import check_counts
from drafter_lab.errors import LabError
from drafter_lab.threads import check_threads

RESULT_FREE_FIELDS = ("threads", "scan_features", "prefetch", "online_val_cache_mb", "keep_best")
"""TrainConfig fields that change how fast a run goes, when bad input is caught or what else it
keeps, never its results: a resume may change them, and cache keys leave them out."""

UNKEYED_DEFAULTS = {"accumulation_steps": 1, "val_temperature": 0.0, "drafter_norm_before_residual": False,
                    "drafter_rope_scaling": "", "drafter_head_dim": 0}
"""TrainConfig fields added after drafters were cached, at the value that computes what the code
before them did, bit for bit: there cache keys leave them out, so cached drafters stay valid."""


@dataclass
class TrainConfig:
    """One EAGLE-3 training run with training-time test (DESIGN section 3)."""

    ttt_steps: int = 5
    """K: draft steps unrolled per position during training (the seeds used 5)."""
    loss_decay: float = 0.8
    """Weight of step k's loss is loss_decay**k."""
    draft_vocab_size: int = 1024
    """N: draft vocabulary size built from the training features (ignored when a vocab is given)."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    warmup_steps: int = 30
    """Linear warmup from 0 to lr over this many optimizer steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay toward lr * min_lr_ratio, which the step after the last would take (transformers'
    cosine schedule with warmup, reached at progress 1; the last step is one short of it)."""
    weight_decay: float = 0.0
    """AdamW weight decay (norm weights are exempt)."""
    adam_beta2: float = 0.95
    """AdamW second-moment decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    batch_size: int = 8
    """Sequences per optimizer step (global, over all ranks). With batch_tokens set it only sizes the
    window of 50 x batch_size sequences sorted by length (data.plan_epoch), so it still shapes the order."""
    batch_tokens: int = 0
    """If > 0, batches hold as many sequences as fit this many padded tokens (global) instead."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: each rank runs its share of the step's batch in at most
    this many parts (balanced in padded tokens), one after another, and their gradients add up to
    the whole batch's (only the rounding differs). Memory then holds one part's activations;
    batch_size stays the optimizer step's (SpecForge's --draft-accumulation-steps multiplies its
    per-GPU batch instead)."""
    max_length: int = 1024
    """Sequences are truncated to this many tokens."""
    scan_features: bool = True
    """Read every feature shard once before training, so that NaN/inf or corrupt features are
    refused before anything is written. False for feature sets too large to read twice: each batch
    is still checked as it is read, and a bad one stops the run with one line naming its shard
    (the last checkpoint stays, and --resume continues from it)."""
    prefetch: bool = True
    """Load the next batch (read from disk, or computed by the target in an online run) in a
    background thread while the current step computes. False loads each batch when it is needed."""
    online_val_cache_mb: float = 1024.0
    """Online runs: keep the validation set's target states in memory after the first validation
    when they fit in this many MB (0: recompute them at every validation). A larger set is recomputed."""
    epochs: int = 3
    """Passes over the training split (max_steps may stop earlier)."""
    max_steps: int = 0
    """Optimizer-step budget; 0 means epochs decide. The schedule spans min(budget, epochs)."""
    eval_every: int = 0
    """Also validate every this many steps (0: only at the end of each epoch)."""
    eval_at_start: bool = False
    """Also validate before the first step: the curve starts at the initial weights (a transfer's
    starting loss next to a fresh drafter's)."""
    eval_batch_size: int = 16
    """Sequences per validation batch."""
    val_temperature: float = 0.0
    """> 0: each validation also predicts a sampled chain served at this temperature (the drafter's
    top-1 drafted and verified by lossless rejection, as SGLang and vLLM serve it): sampled_acc_k,
    sampled_accept_len, and when the validation text is the target's own tokens sampled at this
    temperature (`data prepare --token-exact`, or online `--token-exact`) the served process replayed
    over them, replay_accept_len_k.
    0: the greedy metrics only. Training is the same either way."""
    checkpoint_every: int = 0
    """Also write the train state every this many steps (0: at epoch ends and at the end)."""
    log_every: int = 10
    """Write a train line to metrics.jsonl every this many steps."""
    seed: int = 0
    """Seeds weight init and data order; the same seed gives the same run."""
    init_lm_head_from_target: bool = False
    """Start lm_head from the target's lm_head rows of the draft vocab (needs H == H_target)."""
    device: str = "auto"
    """"auto" picks CUDA when present, else CPU; or "cpu", "cuda", "cuda:1"."""
    bf16: bool = True
    """bf16 autocast on CUDA (CPU always trains in fp32)."""
    threads: int = 0
    """torch CPU threads during the run (0: torch's default). On a shared 2-core machine 1 is often
    faster than 2: OpenMP threads spin-wait when another process holds a core."""
    tensorboard: bool = False
    """Also log to TensorBoard under <out>/tensorboard (needs the tensorboard package)."""
    keep_best: str = ""
    """Also keep the drafter of the best validation so far by this metric in <out>/best, a drafter
    directory like <out> whose best.json names the step: "simulated_accept_len" or "cond_acc_0"
    (higher is better), a loss (lower is better), or any other validation metric. "" keeps only the
    last weights. A resume may set or change it (a new metric's best counts from the resumed
    validations on)."""
    drafter_hidden_size: int = 0
    """Drafter width H (0: the target's). H != H_target gives the drafter its own trained embedding."""
    drafter_intermediate_size: int = 0
    """Drafter MLP width (0: the target's)."""
    drafter_heads: int = 0
    """Drafter query heads (0: the target's)."""
    drafter_kv_heads: int = 0
    """Drafter key/value heads (0: the target's)."""
    drafter_head_dim: int = 0
    """Drafter per-head width (0: the target's head_dim where the drafter keeps the target's hidden size
    and heads, else hidden / heads), e.g. a Qwen3 MoE drafter's 128 at hidden 2048 and 32 heads;
    `--draft-config` sets it. A run records the value that default gives as 0, so runs from before the
    field resume and their cache keys stay."""
    drafter_norm_before_residual: bool = False
    """Start the drafter's residual stream from hidden_norm(h) (speculators' variant; vLLM serves it,
    SGLang does not). A transfer needs the source's setting."""
    drafter_rope_scaling: str = ""
    """The drafter's RoPE scaling as config.json's `rope_scaling` JSON ("" = plain RoPE), e.g. a
    SpecForge Llama-3.1 drafter's llama3 scaling; `--draft-config` sets it. A transfer needs the
    source's."""


AT_LEAST_ONE = ("ttt_steps", "draft_vocab_size", "accumulation_steps", "max_length", "epochs", "eval_batch_size",
                "log_every")
AT_LEAST_ZERO = ("lr", "warmup_steps", "weight_decay", "grad_clip", "batch_tokens", "online_val_cache_mb", "max_steps",
                 "eval_every", "val_temperature", "checkpoint_every", "threads", "drafter_hidden_size",
                 "drafter_intermediate_size", "drafter_heads", "drafter_kv_heads", "drafter_head_dim")


def check_config(cfg: TrainConfig) -> None:
    """Settings that would fail mid-run (a division by zero at the first train line, an empty validation
    batch after a whole epoch) or mean nothing, refused in one line before anything is written."""
    check_counts(cfg, AT_LEAST_ONE, AT_LEAST_ZERO)
    check_threads(cfg.threads, "threads")
    if cfg.batch_tokens == 0 and cfg.batch_size < 1:
        raise LabError(f"batch_size must be >= 1 (or batch_tokens set), got {cfg.batch_size}")
    if not 0 <= cfg.seed < 2**32:  # torch takes seeds below 2**64, and data.plan_epoch's is seed * 100_003 + epoch
        raise LabError(f"seed must be in [0, 2**32), got {cfg.seed}")
    if not 0 < cfg.loss_decay < math.inf:
        raise LabError(f"loss_decay must be a finite number > 0, got {cfg.loss_decay}")
    if not 0 <= cfg.min_lr_ratio <= 1 or not 0 <= cfg.adam_beta2 < 1:
        raise LabError(f"min_lr_ratio must be in [0, 1] and adam_beta2 in [0, 1), got {cfg.min_lr_ratio} and "
                       f"{cfg.adam_beta2}")
    if cfg.drafter_head_dim % 2:  # as DrafterConfig.attention_problem, but before a run loads its target
        raise LabError(f"drafter_head_dim {cfg.drafter_head_dim} is odd: RoPE rotates the two halves of each head")
    # These here, not where the run meets them, so that a --config file holding them is named (commands.checked);
    # imported here, as they import torch, which the CLI does not while it builds its parsers.
    from drafter_lab.drafter.formats import rope_scaling_from_text
    from drafter_lab.targets.hf import resolve_device

    if cfg.keep_best:
        check_metric(cfg, "keep_best", cfg.keep_best)
    rope_scaling_from_text(cfg.drafter_rope_scaling, "drafter_rope_scaling")
    resolve_device(cfg.device)


def check_metric(cfg: TrainConfig, what: str, name: str) -> None:
    """`name` (the setting `what`) is a validation metric of `cfg`'s runs (whether the replay's are
    measured depends on the validation text, which the run checks)."""
    from drafter_lab.train.metrics import metric_names

    names = metric_names(cfg.ttt_steps, cfg.val_temperature > 0, cfg.val_temperature > 0)
    if name not in names:
        raise LabError(f"{what}: {name!r} is not a validation metric; one of {', '.join(names)}")
