"""N-gram drafting's settings, apart from its torch code so that the CLI starts without torch."""

from __future__ import annotations

from dataclasses import dataclass

from drafter_lab.errors import LabError


@dataclass
class NgramConfig:
    """Which n-grams are looked up (vLLM's `prompt_lookup_min` and `prompt_lookup_max`)."""

    min_n: int = 2
    """Shortest suffix that may match; 1 proposes after any repeated token (more drafts, fewer accepted)."""
    max_n: int = 4
    """Longest suffix tried first: a longer match predicts its continuation better."""
    across_prompts: bool = False
    """Also look up the rows decoded before (earlier prompts' tokens and outputs), after the row's
    own tokens at each length, as SGLang's NGRAM cache does across requests."""

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise LabError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")

    def describe(self) -> str:
        return f"n-gram lookup ({self.min_n}..{self.max_n}{', across prompts' if self.across_prompts else ''})"
