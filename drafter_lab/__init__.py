"""drafter_lab: a reproducible lab for EAGLE-3 speculative-decoding drafters."""

__version__ = "0.1.0"
