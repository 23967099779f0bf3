"""Does a drafter fit a target? Vocabulary, hidden size, aux layers and (when recorded) fingerprint.

A drafter that does not fit would decode garbage or crash deep inside a forward pass; here it is
refused up front with one line naming the drafter and the mismatch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from drafter_lab.errors import LabError
from drafter_lab.targets.hf import check_aux_layer_ids, default_aux_layer_ids


def check_config(cfg, target, where) -> None:
    """Shape checks on a DrafterConfig against a loaded target."""
    if cfg.target_vocab_size != target.vocab_size:
        raise LabError(
            f"drafter vocab does not fit the target: its t2d maps a {cfg.target_vocab_size}-token vocab, "
            f"the target has {target.vocab_size} tokens",
            where,
        )
    if cfg.target_hidden_size != target.hidden_size:
        raise LabError(
            f"drafter hidden size does not fit the target: fc takes 3 x {cfg.target_hidden_size}, "
            f"the target's hidden states are {target.hidden_size} wide",
            where,
        )
    if cfg.aux_layer_ids:
        check_aux_layer_ids(cfg.aux_layer_ids, target.num_layers, where)


def check_pair(target, drafter, where=None) -> None:
    """Everything about a built drafter that must agree with the target (tensors included).

    A drafter without recorded aux layer ids gets the default [2, L//2, L-3].
    """
    check_config(drafter.config, target, where)
    if drafter.t2d.numel() != target.vocab_size:
        raise LabError(
            f"drafter vocab does not fit the target: t2d has {drafter.t2d.numel()} entries, "
            f"the target has {target.vocab_size} tokens",
            where,
        )
    fc_in = drafter.fc.weight.shape[1]
    if fc_in != 3 * target.hidden_size:
        raise LabError(
            f"drafter hidden size does not fit the target: fc takes {fc_in}, the target gives "
            f"3 x {target.hidden_size} = {3 * target.hidden_size}",
            where,
        )
    ids = torch.arange(drafter.d2t.numel(), device=drafter.d2t.device) + drafter.d2t
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size):
        raise LabError(
            f"drafter d2t maps draft tokens to target ids {int(ids.min())}..{int(ids.max())}, "
            f"outside the target's 0..{target.vocab_size - 1}",
            where,
        )
    if not drafter.config.aux_layer_ids:
        drafter.config.aux_layer_ids = default_aux_layer_ids(target.num_layers)


def load_for_target(drafter_dir, target, allow_other_target: bool = False):
    """Load a drafter checkpoint for `target` after checking that it fits.

    The drafter embeds tokens with the target's embedding when the widths agree (as SGLang does).
    A drafter trained on another target (recorded fingerprint differs, or another vocabulary size) is
    refused unless `allow_other_target` (zero-shot transfer runs, like the seeds' Phase-0 probe, want
    exactly that; one for a target of another vocabulary size is served as engines serve it there).
    """
    from drafter_lab.drafter.checkpoint import (
        load_drafter,
        read_checkpoint,
        read_config,
        recorded_fingerprint,
        served_with_vocab,
    )

    drafter_dir = Path(drafter_dir)
    cfg, _ = read_config(drafter_dir)
    # what no flag fixes (hidden size, aux layers) first, so that --allow-other-target is hinted only where it helps
    check_config(dataclasses.replace(cfg, target_vocab_size=target.vocab_size), target, drafter_dir)
    if cfg.target_vocab_size != target.vocab_size and not allow_other_target:
        served_with_vocab(read_checkpoint(drafter_dir), target.vocab_size)  # what the flag would not fix, first
        raise LabError(f"drafter vocab does not fit the target: it was trained for a {cfg.target_vocab_size}-token "
                       f"vocab, the target has {target.vocab_size} tokens; pass --allow-other-target to decode with "
                       "it as engines serve it there (its draft ids through d2t)", drafter_dir)
    recorded = recorded_fingerprint(drafter_dir)
    if recorded is not None and not target.known_as(recorded) and not allow_other_target:
        raise LabError(
            f"drafter was trained on target {recorded}, not on {target.path} ({target.fingerprint}); "
            "pass --allow-other-target to decode with it anyway",
            drafter_dir,
        )
    drafter = load_drafter(drafter_dir, device=target.device, target=target, vocab_size=target.vocab_size)
    check_pair(target, drafter, drafter_dir)
    return drafter.eval()
