"""Study configs: which target pair, how much data, and the training budget every arm gets."""

from __future__ import annotations

from dataclasses import dataclass, field

from drafter_lab.errors import LabError


@dataclass
class ExperimentConfig:
    """The seeds' transfer-vs-scratch study, end to end, as one config."""

    name: str
    """Config name; the run directory is runs/<name>-<timestamp>/."""
    target_preset: str = "tiny-cpu"
    """Target-pair preset passed to `targets build` (base = "K2", tuned = "K2.5")."""
    drift_levels: list[float] = field(default_factory=lambda: [1.0])
    """Drift knob values for `tuned`; one level is a study, three or more make a drift sweep."""
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
    seed: int = 0
    """One seed for every arm (same data order, same init for untransferred weights)."""
    device: str = "auto"
    """"auto" picks CUDA when present."""
    threads: int = 1
    """torch CPU threads for every stage (0: torch's default). Tiny models on shared cores run ~3x
    faster with 1 than with 2: OpenMP threads spin-wait whenever another process holds a core."""


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
