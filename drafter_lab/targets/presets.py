"""Target-pair configs: what `targets build` trains, and the named presets.

`drift` is the knob for how far `tuned` ("K2.5") moves from `base` ("K2"): the fine-tune runs
`round(drift * tune_steps)` steps of one fixed, seeded trajectory at a constant learning rate, so a
lower drift is exactly an earlier point of the same run. 0 makes `tuned` a copy of `base`; values
above 1 run the same fine-tune further.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from drafter_lab.config import check_counts
from drafter_lab.errors import LabError

SMALLEST_VOCAB = 256 + 3
"""The byte-level BPE's 256 bytes and tokenizer.SPECIAL_TOKENS: the smallest vocabulary it trains."""


@dataclass(frozen=True)
class TargetConfig:
    seed: int = 0
    """Seeds the corpus split, weight init and batch order; CPU builds are bit-for-bit repeatable."""
    corpus_max_files: int = 0
    """Use this many stdlib files, evenly spread over the sorted list (0 = all of them)."""
    max_source_chars: int = 1200
    """Skip functions whose source (docstring included) is longer than this."""
    shifted_share: float = 0.35
    """Fraction of functions that go to the SHIFTED ("explain code") slice instead of BASE."""
    vocab_size: int = 4096
    """Byte-level BPE vocabulary size (shared by base and tuned, as K2 and K2.5 share theirs)."""
    hidden_size: int = 128
    """Model width."""
    intermediate_size: int = 384
    """SwiGLU MLP width."""
    num_layers: int = 8
    """Decoder layers (>= 8 so the default aux layers [2, L//2, L-3] are distinct)."""
    num_heads: int = 4
    """Attention (query) heads."""
    num_kv_heads: int = 2
    """Key/value heads; fewer than num_heads makes it grouped-query attention (GQA)."""
    max_position_embeddings: int = 2048
    """Longest sequence the saved config accepts (prompt + generation during regeneration)."""
    seq_len: int = 256
    """Training window in tokens; windows start at a conversation start and pack the ones after."""
    batch_size: int = 4
    """Windows per optimizer step (small: on a CPU budget, more steps beat bigger batches)."""
    base_steps: int = 320
    """Optimizer steps training `base` from scratch on the BASE slice."""
    base_lr: float = 3e-3
    """Peak learning rate for `base` (linear warmup, then cosine decay to a tenth of it)."""
    warmup_steps: int = 25
    """Linear warmup steps, for both base and the fine-tune."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms)."""
    tune_steps: int = 100
    """Fine-tune steps at drift 1.0; the run does round(drift * tune_steps)."""
    tune_lr: float = 1e-3
    """Constant (after warmup) fine-tune learning rate, so lower drifts are prefixes of one run."""
    tune_shifted_fraction: float = 0.75
    """Share of each fine-tune batch drawn from the SHIFTED slice; the rest is BASE text."""
    drift: float = 1.0
    """How far tuned moves from base, >= 0 (scales the fine-tune steps; 0 = copy of base, 1 = the
    preset's `tune_steps`, above 1 the same fine-tune continued)."""
    train_prompts: int = 320
    """Held-out conversations written to prompts-train.jsonl (half from each slice)."""
    eval_prompts: int = 32
    """Held-out conversations written to prompts-eval.jsonl (half from each slice)."""
    drift_conversations: int = 24
    """Held-out conversations per slice on which drift (CKA, KL) is measured."""
    device: str = "auto"
    """Where to train: auto (cuda when available), cpu or cuda."""
    threads: int = 0
    """torch CPU threads while building (0 = torch's default, one per core). 1 suits tiny models and
    busy machines: oversubscribed OpenMP threads slow small ops down by an order of magnitude."""

    def __post_init__(self):
        # Each would otherwise fail mid-build with a traceback, or build a pair that is not what was asked.
        check_counts(self, ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "max_position_embeddings",
                            "max_source_chars", "seq_len", "batch_size", "train_prompts", "eval_prompts", "drift_conversations"),
                     ("corpus_max_files", "base_steps", "base_lr", "warmup_steps", "weight_decay", "tune_steps",
                      "tune_lr", "drift", "threads"))
        if not math.isfinite(self.drift * self.tune_steps):  # round() of it: an OverflowError once base is trained
            raise LabError(f"drift {self.drift} x tune_steps {self.tune_steps} is past any number of fine-tune steps")
        if not -(2**63) <= self.seed < 2**64 - 1:  # torch's 64-bit seeds (tuned's is seed + 1): else a mid-build traceback
            raise LabError(f"seed must be in {-(2**63)}..{2**64 - 2}, got {self.seed}")
        if self.vocab_size < SMALLEST_VOCAB:  # the trainer would quietly make that size: not the target asked for
            raise LabError(f"vocab_size must be >= {SMALLEST_VOCAB} (the 256 bytes and the special tokens), "
                           f"got {self.vocab_size}")
        for name in ("shifted_share", "tune_shifted_fraction"):  # else a negative batch share's traceback
            if not 0 <= getattr(self, name) <= 1:  # nan too
                raise LabError(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.shifted_share in (0, 1):  # else "corpus too small" once the corpus is read, whatever its size
            raise LabError(f"shifted_share {self.shifted_share} leaves the {'shifted' if self.shifted_share == 0 else 'base'} "
                           f"slice empty; it must be above 0 and below 1")
        if self.seq_len < 2:  # a window of one token has no next token: drift's mean divided by zero, after base trained
            raise LabError(f"seq_len must be >= 2 (a window needs a next token to predict), got {self.seq_len}")
        if self.seq_len > self.max_position_embeddings:  # the saved config would refuse what it was trained on
            raise LabError(f"seq_len {self.seq_len} exceeds max_position_embeddings {self.max_position_embeddings}")
        if self.num_layers < 8:
            raise LabError(f"num_layers must be >= 8 for distinct aux layers, got {self.num_layers}")
        if self.num_heads % self.num_kv_heads or self.hidden_size % self.num_heads:
            raise LabError(
                f"need hidden_size % num_heads == 0 and num_heads % num_kv_heads == 0, got "
                f"{self.hidden_size}/{self.num_heads}/{self.num_kv_heads}"
            )
        if self.hidden_size // self.num_heads % 2:  # rotary embeddings: a shape traceback in base's first step
            raise LabError(f"hidden_size / num_heads (the head size) must be even, got "
                           f"{self.hidden_size}/{self.num_heads} = {self.hidden_size // self.num_heads}")

    @property
    def heldout_per_slice(self) -> int:
        half = lambda n: (n + 1) // 2  # noqa: E731
        return half(self.train_prompts) + half(self.eval_prompts) + self.drift_conversations

    def base_fields(self) -> dict:
        """The fields `base` depends on (everything but the fine-tune), for its cache key."""
        tune = {"tune_steps", "tune_lr", "tune_shifted_fraction", "drift"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in tune}


PRESETS: dict[str, TargetConfig] = {
    # Seconds on one core; learns little. For tests of everything downstream.
    "micro": TargetConfig(
        corpus_max_files=40,
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        seq_len=64,
        batch_size=8,
        base_steps=12,
        warmup_steps=2,
        tune_steps=6,
        train_prompts=16,
        eval_prompts=4,
        drift_conversations=4,
        device="cpu",
        threads=1,
    ),
    # The default pair: builds in under 5 minutes on 2 CPU cores. One thread: two would be faster
    # on an idle machine, but OpenMP threads that share cores with other work slow down ~10x.
    "tiny-cpu": TargetConfig(device="cpu", threads=1),
    # Bigger models and all the data, for one GPU.
    "gpu-small": TargetConfig(
        max_source_chars=2400,
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_layers=12,
        num_heads=8,
        num_kv_heads=2,
        seq_len=512,
        batch_size=16,
        base_steps=1200,
        base_lr=1.5e-3,
        warmup_steps=100,
        tune_steps=400,
        tune_lr=5e-4,
        train_prompts=1024,
        eval_prompts=64,
        drift_conversations=64,
    ),
}


def resolve(preset_or_config) -> TargetConfig:
    """A TargetConfig from a preset name or a config (returned as is)."""
    if isinstance(preset_or_config, TargetConfig):
        return preset_or_config
    try:
        return PRESETS[preset_or_config]
    except KeyError:
        raise LabError(f"unknown preset {preset_or_config!r}; known: {', '.join(PRESETS)}") from None
