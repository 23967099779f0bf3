"""Study configs: which target pair, how much data, and the training budget every arm gets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from drafter_lab.config import check_counts
from drafter_lab.errors import LabError


def level_name(drift: float) -> str:
    """A drift level's name in run and cache directories, manifests and reports: short (`0.5`) and
    distinct for distinct levels (`:g` alone makes 0.1234561 and 0.1234564 one directory)."""
    drift = float(drift) + 0.0  # -0.0 is 0: one level, one directory and cache entry
    short = f"{drift:g}"
    return short if float(short) == drift else repr(drift)


@dataclass
class ExperimentConfig:
    """The seeds' transfer-vs-scratch study, end to end, as one config."""

    name: str
    """Config name; the run directory is runs/<name>-<timestamp>/."""
    target_preset: str = "tiny-cpu"
    """Target-pair preset passed to `targets build` (base = "K2", tuned = "K2.5")."""
    drift_levels: list[float] = field(default_factory=lambda: [1.0])
    """Drift knob values for `tuned`; one level is a study, two or more make a drift sweep."""
    max_length: int = 384
    """Longest captured sequence (tokens), prompt plus regenerated answer."""
    max_new_tokens: int = 96
    """Tokens each target generates per assistant turn when regenerating its data."""
    regen_temperature: float = 1.0
    """Sampling temperature of the regeneration. Greedy answers of the tiny targets are degenerate
    (61-72 distinct answer tokens in 8,800 on tiny-cpu), so both draft vocabs would be the same
    padded list and the remap could not matter; sampling gives each target its own token mix."""
    regen_batch_size: int = 32
    """Conversations generated together."""
    draft_vocab_size: int = 512
    """N, the draft vocabulary of every drafter in the study."""
    source_steps: int = 400
    """Optimizer steps for the source ("K2") drafter trained on `base` data."""
    arm_steps: int = 200
    """Optimizer steps for every arm on `tuned` data: equal budgets."""
    eval_every: int = 25
    """Validation every this many steps, for the learning curves."""
    probe_pilot_steps: int = 48
    """Steps of each arm of the probe's pilot (scratch and transfer with remap, the arms' recipe cut
    short); its verdict is then checked against arms trained `arm_steps`. 0: the CKA rule decides."""
    batch_size: int = 8
    """Sequences per optimizer step."""
    lr: float = 3e-3
    """Peak learning rate for scratch and for the untransferred parameters."""
    transfer_lr_scale: float = 1.0
    """Learning-rate multiplier for transferred weights in arms (b), (c), (d)."""
    l2sp: float = 0.0
    """L2-SP strength for arm (d); 0 leaves the arm out."""
    arms: list[str] = field(default_factory=lambda: ["a", "b", "c"])
    """Arms to train: a scratch, b transfer with remap, c transfer without remap (d follows l2sp).
    a and b are required: the measured outcome and the transfer gain are (b) - (a)."""
    ttt_steps: int = 5
    """K, the training-time-test steps."""
    served_eval: bool = True
    """Also decode eval prompts with each drafter and report served accept length."""
    served_prompts: int = 16
    """Eval prompts decoded per drafter for the served accept length."""
    served_steps: int = 4
    """Chain draft steps for the served accept length."""
    ngram_baseline: bool = True
    """With served_eval, also decode the eval prompts with n-gram lookup (no drafter), in each row's
    own tokens and across prompts: the bar a trained drafter has to clear."""
    seed: int = 0
    """One seed for every arm (same data order, same init for untransferred weights)."""
    device: str = "auto"
    """"auto" picks CUDA when present."""
    threads: int = 1
    """torch CPU threads for every stage (0: torch's default). Tiny models on shared cores run ~3x
    faster with 1 than with 2: OpenMP threads spin-wait whenever another process holds a core."""

    def __post_init__(self):
        if not self.drift_levels:  # `--drift-levels ""` would run no study and still exit 0
            raise LabError("drift_levels is empty: give at least one drift level")
        bad = [d for d in self.drift_levels if not 0 <= d < math.inf]
        if bad:
            raise LabError(f"drift_levels must be >= 0 and finite, got {', '.join(map(str, bad))}")
        if len(set(self.drift_levels)) < len(self.drift_levels):  # one directory, two studies
            raise LabError(f"drift_levels repeat: {', '.join(map(level_name, self.drift_levels))}")
        # source_steps or arm_steps 0 would be TrainConfig's max_steps 0, "no limit": 10,000 epochs
        check_counts(self, ("max_length", "max_new_tokens", "regen_batch_size", "draft_vocab_size", "source_steps",
                      "arm_steps", "batch_size", "ttt_steps", "served_prompts", "served_steps"),
               ("regen_temperature", "eval_every", "probe_pilot_steps", "lr", "transfer_lr_scale", "l2sp", "threads"))
        if not 0 <= self.seed < 2**32:  # TrainConfig's range
            raise LabError(f"seed must be in [0, 2**32), got {self.seed}")
        unknown = sorted(set(self.arms) - {"a", "b", "c"})
        if unknown or not {"a", "b"} <= set(self.arms) or len(set(self.arms)) < len(self.arms):
            raise LabError(f"arms must include a and b and be among a, b, c, each once (d follows l2sp); got {self.arms}")


@dataclass
class ProbeThresholds:
    """Where the probe draws its lines, set from the drift sweep (README, "The transfer study"):
    `drafter-lab experiment --config drift-sweep`, tiny-cpu pair, knobs 0 / 0.5 / 1, 200 steps per arm."""

    reuse_fraction: float = 0.8
    """Reuse when zero-shot simulated accept length >= this fraction of home accept length.
    Sweep: zero-shot / home = 1.00 at knob 0 (measured: reuse, the source beats 200 steps of scratch
    2.61 vs 2.11), then 0.61 at knob 0.5 and 0.63 at knob 1 (measured: not reuse, zero-shot 1.14 and
    1.46 vs scratch 1.83 and 1.97). Nothing falls between 0.63 and 1.0; 0.8 sits mid-gap."""
    transfer_min_cka: float = 0.8
    """Without a pilot: transfer (with remap) only when every aux layer's CKA (source vs new
    target) is >= this. Sweep: transfer paid at every level measured: min aux CKA 0.875 at knob 0.5
    (+6.7 points of cond_acc_0 over scratch), 0.854 at knob 1 (+7.4) and 0.801 at knob 4 (+4.3
    after 200 steps, +1.6 after 600). It also paid below the line, where this rule says scratch:
    knob 4 on plain (not regenerated) data, CKA 0.764 (+12.1), and a successor trained from a fresh
    init, CKA 0.735 (+6.1). CKA is blind to what the transfer carries, hence the pilot."""
    pilot_min_gain: float = 0.01
    """With a pilot: transfer when, at the pilot's last step, its val cond_acc_0 leads scratch's by at
    least this (1 point, the study's own "transfer pays" margin); otherwise the transfer buys nothing
    measurable and scratch, with no dependency on the old drafter, is the simpler choice. A verdict
    for budgets near the pilot's: leads shrink with budget (knob 4: +24.1 points at 48 steps, +4.3
    at 200, +1.6 at 600, -0.5 at 2000, where scratch had caught up), and with transferred weights at
    0.1x the rate they turn negative (-2.6 at knob 4, -1.9 at knob 1, over steps 1000-2000) where
    the pilot led by +18.4 and +27.0."""

    def __post_init__(self):
        for f in fields(self):
            if not math.isfinite(getattr(self, f.name)):  # a nan line would compare false either way
                raise LabError(f"{f.name} must be a finite number, got {getattr(self, f.name)}")
        # a line no measure reaches silently decides every probe one way ("1" read as one point, "80" as 80%);
        # reuse_fraction has no such bound: zero-shot accept may exceed home's many times over. Lines below
        # every measure stay allowed (-1 makes its test always pass)
        if self.pilot_min_gain > 1:
            raise LabError(f"pilot_min_gain is a fraction (0.01 = 1 point of cond_acc_0), and a lead is at most 1: "
                           f"{self.pilot_min_gain:g} is never met")
        if self.transfer_min_cka > 1:
            raise LabError(f"transfer_min_cka is a linear CKA, at most 1 (0.8 = 80%): {self.transfer_min_cka:g} is "
                           "never met")


@dataclass
class ProbeConfig:
    """How much held-out data the probe reads."""

    max_sequences: int = 64
    """Held-out sequences evaluated (val split of the new target's features)."""
    cka_tokens: int = 4096
    """Tokens sampled for the aux-layer CKA."""
    ttt_steps: int = 5
    """Draft steps K evaluated offline."""
    batch_size: int = 8
    """Sequences per evaluation batch."""
    pilot_steps: int = 48
    """Optimizer steps of each pilot arm (scratch, transfer with remap) on the new target's train
    split (48: about a minute on one core for the tiny pair); 0 skips the pilot and the transfer
    verdict falls back to aux CKA."""
    device: str = "auto"
    """Where every signal and the pilot run: auto (CUDA when visible), cpu, cuda or cuda:N. The pilot's
    recipe (--pilot-config) trains here too."""

    def __post_init__(self):
        check_counts(self, ("max_sequences", "ttt_steps", "batch_size"), ("pilot_steps",))
        if self.cka_tokens < 2:  # CKA centres each feature: one token leaves nothing, and 0/0 is nan
            raise LabError(f"cka_tokens must be >= 2, got {self.cka_tokens}")


PRESETS: dict[str, ExperimentConfig] = {
    "tiny-cpu": ExperimentConfig(name="tiny-cpu"),
    "drift-sweep": ExperimentConfig(
        name="drift-sweep", drift_levels=[0.0, 0.5, 1.0], arms=["a", "b"], served_eval=False,
    ),
    # The seeds' fine-tune: the old drafter's weights trained at a tenth of the rate, long enough
    # for scratch to converge. On the lab's pair the transfer leads for ~200 steps, then trails.
    "seeds-finetune": ExperimentConfig(
        name="seeds-finetune", drift_levels=[4.0], arms=["a", "b"], served_eval=False, arm_steps=2000,
        eval_every=100, transfer_lr_scale=0.1,
    ),
    "gpu-small": ExperimentConfig(
        name="gpu-small", target_preset="gpu-small", max_length=512, max_new_tokens=256,
        regen_batch_size=64, draft_vocab_size=4096, source_steps=1500, arm_steps=600, batch_size=16,
        lr=1e-3, served_prompts=32,
    ),
    # The smallest end-to-end config: the container smoke test and CI's experiment check.
    "smoke": ExperimentConfig(
        name="smoke", target_preset="micro", max_length=128, max_new_tokens=48, draft_vocab_size=256,
        source_steps=30, arm_steps=20, eval_every=10, probe_pilot_steps=8, batch_size=4, served_prompts=4,
    ),
}


def get_config(name: str) -> ExperimentConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise LabError(f"unknown experiment config {name!r}; known: {', '.join(PRESETS)}") from None
