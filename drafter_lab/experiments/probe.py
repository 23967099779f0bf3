"""The Phase-0 probe: minutes to tell whether an existing drafter will pay on a new target.

Signals, all on the new target's held-out features (its data's val split, or with `val_data` a
feature directory of its own, e.g. captured from the prompts it will serve):
- zero-shot acceptance: offline `cond_acc_k` and the simulated accept length of the drafter as is
  (its lm_head re-indexed to nothing: it runs with its own d2t, exactly as it would be served);
- home acceptance: the same drafter on the *source* target's features for the same tokens (when
  the source target is given), so the zero-shot figure has a reference (where the tokenizers differ,
  over the sequences the source can read, and the reuse ratio takes the zero-shot figure over those);
- vocab agreement: how many draft positions of the drafter's d2t mean the same target token as
  the new data's draft vocab (the seeds' 252 / 32,000), and how many tokens both hold; by token
  string where the two targets' tokenizers differ (as the transfer remaps), else by id;
- aux alignment: linear CKA between the source and new target's aux hidden states, per aux layer;
- the pilot (`experiments.pilot`, when `pilot_steps` > 0): scratch and transfer-with-remap trained
  side by side for a few steps, the transfer question measured at a small budget.

Verdict (thresholds in `ProbeThresholds`, justified by the drift sweep in the README):
- "reuse as is" when zero-shot accept length keeps at least `reuse_fraction` of home accept;
- else, with a pilot, "transfer with remap" when the transfer leads scratch by at least
  `pilot_min_gain` at the pilot's end, "train from scratch" when it does not;
- else (no pilot) "transfer with remap" when every aux layer keeps CKA >= `transfer_min_cka`;
- else "train from scratch": the drafter's fc and midlayer read representations that moved.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from pathlib import Path

import torch

from drafter_lab.data.shards import FeatureSet, Sequence
from drafter_lab.data.vocab import build_vocab, compare_vocabs, vocab_of_drafter
from drafter_lab.drafter.checkpoint import load_drafter, read_config
from drafter_lab.drafter.transfer import check_source_target, source_tokens
from drafter_lab.errors import LabError
from drafter_lab.experiments.config import ProbeConfig, ProbeThresholds
from drafter_lab.experiments.pilot import closing, lead_text, pilot_config, run_pilot
from drafter_lab.progress import log
from drafter_lab.spec.pairing import check_config
from drafter_lab.targets.drift import linear_cka
from drafter_lab.targets.fingerprint import weight_files
from drafter_lab.targets.hf import (
    Target,
    check_aux_layer_ids,
    check_tokenizer_dir,
    load_target,
    load_target_head,
    resolve_device,
)
from drafter_lab.targets.hidden import run_capturing
from drafter_lab.train.config import TrainConfig
from drafter_lab.train.metrics import evaluate
from drafter_lab.train.sources import HeldOutFeatures

VERDICTS = ("reuse as is", "transfer with remap", "train from scratch")


def _source_features(source: Target, sequences: list[Sequence], aux_ids: list[int]) -> list[Sequence]:
    """Run the source target on the new target's tokens: its aux and final states, same positions."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            _, hs = run_capturing(source.model, aux_ids, input_ids=seq.input_ids[None].to(source.device))
            out.append(
                Sequence(
                    seq_id=seq.seq_id,
                    input_ids=seq.input_ids,
                    loss_mask=seq.loss_mask,
                    aux_hidden=torch.cat([hs[i][0] for i in aux_ids], -1).float().cpu(),
                    final_hidden=hs[-1][0].float().cpu(),
                )
            )
    return out


def aux_cka(src: list[Sequence], new: list[Sequence], n_aux: int, tokens: int, seed: int = 0) -> list[float]:
    """Linear CKA per aux layer between two feature sets of the same tokens."""
    a = torch.cat([s.aux_hidden for s in src]).float()
    b = torch.cat([s.aux_hidden for s in new]).float()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(a.shape[0], generator=g)[:tokens]
    wa, wb = a.shape[1] // n_aux, b.shape[1] // n_aux
    return [linear_cka(a[idx, i * wa:(i + 1) * wa], b[idx, i * wb:(i + 1) * wb]) for i in range(n_aux)]


def _cka_text(x: float, line: float) -> str:
    """`x` to 3 decimals, or to as many as keep it on its side of `line`: 0.79996 under a 0.8 line
    reads "0.79996", not "0.800 (< 0.8)"."""
    for digits in range(3, 17):
        text = f"{x:.{digits}f}"
        if (float(text) >= line) == (x >= line):
            return text
    return repr(x)


def decide(zero_shot_accept: float, home_accept: float | None, ckas: list[float] | None,
           th: ProbeThresholds, pilot: dict | None = None,
           unmeasured: str = "no source target given") -> tuple[str, str]:
    """The verdict and its reason. `zero_shot_accept` and `home_accept` are over the same text;
    `unmeasured` says why `ckas` is None."""
    if home_accept is not None and home_accept > 0 and zero_shot_accept >= th.reuse_fraction * home_accept:
        return VERDICTS[0], (
            f"zero-shot accept {zero_shot_accept:.2f} keeps {zero_shot_accept / home_accept:.0%} of home "
            f"accept {home_accept:.2f} (>= {th.reuse_fraction:.0%})"
        )
    if pilot is not None:
        lead = f"pilot of {pilot['steps']} steps per arm: transfer - scratch = {lead_text(pilot, th.pilot_min_gain)}"
        if pilot["gain"] >= th.pilot_min_gain:
            tail = "; the lead is closing, so a much longer budget may erase it" if closing(pilot) else ""
            scale = pilot.get("transfer_lr_scale", 1.0)
            if scale < 1:
                tail += (f"; the transferred weights train at {scale:g}x the rate, and in this lab's runs at 0.1x "
                         "pilot leads of +18 and +27 points ended 2-3 points behind scratch after 2000 steps "
                         "(the seeds' negative transfer): for a long run, fine-tune at the full rate")
            if tail:
                tail += " (`train --stop-if-behind SCRATCH_RUN` stops it if it falls behind)"
            return VERDICTS[1], f"{lead} (>= {100 * th.pilot_min_gain:g} at the end){tail}"
        return VERDICTS[2], f"{lead} (< {100 * th.pilot_min_gain:g} at the end): the old weights buy nothing"
    if ckas is None:
        return VERDICTS[2], f"{unmeasured}: aux alignment unknown, so no basis to expect transfer to pay"
    if not all(map(math.isfinite, ckas)):  # min() over a nan depends on where it sits
        return VERDICTS[2], (f"aux layer CKA is undefined ({', '.join(f'{c:.3f}' for c in ckas)}: features without "
                             "variance), so no basis to expect transfer to pay")
    low = _cka_text(min(ckas), th.transfer_min_cka)
    if min(ckas) >= th.transfer_min_cka:
        return VERDICTS[1], (
            f"aux layers stay aligned (min CKA {low} >= {th.transfer_min_cka}); "
            "the midlayer's inputs barely moved, so its weights are a head start once lm_head is re-indexed"
        )
    return VERDICTS[2], (
        f"aux layer CKA drops to {low} (< {th.transfer_min_cka}): fc and midlayer were fit to "
        "representations that moved; expect negative transfer as in the seeds (38% vs 74.7%)"
    )


def _in_source_tokens(val: list[Sequence], tokens: torch.Tensor | None) -> tuple[list[Sequence], list[Sequence]]:
    """The sequences the source target can read as the new one does, (theirs, ours): all of them where
    the tokenizers agree (`tokens` None), else those whose every token the source's vocabulary has,
    their ids mapped token by token (transfer.token_map), so both read the same text at the same
    positions; fed unmapped, the source would read other text."""
    if tokens is None:
        return val, val
    kept = [s for s in val if bool((tokens[s.input_ids] >= 0).all())]
    return [replace(s, input_ids=tokens[s.input_ids]) for s in kept], kept


def _at_home(drafter_dir, source_target_dir, theirs: list[Sequence], ours: list[Sequence], aux_ids: list[int],
             cfg: ProbeConfig, device) -> tuple[dict, list[float]]:
    """The drafter on its own (source) target over `theirs`, and the aux CKA between the two targets
    at `aux_ids` (the features'; a drafter may not record its own) over `theirs` and `ours`
    (`_in_source_tokens`). The whole source model is loaded here and released on return."""
    source = load_target(source_target_dir, device=device, tokenizer=False)
    try:  # the wrong --source-target would fail deep in a forward pass (another width, too few layers)
        check_config(read_config(drafter_dir)[0], source, None)
        check_aux_layer_ids(aux_ids, source.num_layers, None)
    except LabError as e:
        raise LabError(f"{e} (--source-target {source_target_dir})", drafter_dir) from None
    drafter = load_drafter(drafter_dir, target=source, device=device)  # at home it embeds with its own target's
    src = _source_features(source, theirs, aux_ids)
    home = evaluate(drafter, source.lm_head_weight(), src, cfg.ttt_steps, cfg.batch_size,
                    logit_map=source.logit_map)
    return home, aux_cka(src, ours, 3, cfg.cka_tokens)


def _check_source_target(drafter_dir, given: Path) -> None:
    """Refuse a --source-target that is no model directory (the home signal runs the model, after the other
    signals' minutes) or holds other weights than the drafter's run records (transfer.check_source_target)."""
    check_tokenizer_dir(given)
    held = "a tokenizer alone" if not (given / "config.json").is_file() else "no weights" if not weight_files(given) else None
    if held:
        raise LabError(f"--source-target holds {held}: the probe runs the source target (its accept at home), "
                       "give the model's directory", given)
    check_source_target(drafter_dir, given)


def probe(drafter_dir, target_dir, data_dir, source_target_dir=None, *, cfg: ProbeConfig | None = None,
          thresholds: ProbeThresholds | None = None, pilot_recipe: TrainConfig | None = None,
          pilot_dir=None, transfer_lr_scale: float = 1.0, val_data=None) -> dict:
    """All signals and the verdict. The pilot (cfg.pilot_steps > 0) trains with `pilot_recipe`
    (default TrainConfig()) cut to the pilot's steps, keeping its arms in `pilot_dir` if given.
    `val_data` (a feature directory of the new target) replaces the data's val split for every
    signal, the pilot's validations included."""
    cfg = cfg or ProbeConfig()
    th = thresholds or ProbeThresholds()
    device = resolve_device(cfg.device)
    if source_target_dir is not None:  # cheap, so refused before the val features are read and the drafter loaded
        _check_source_target(drafter_dir, Path(source_target_dir))
    target = load_target_head(target_dir, device=device)  # features are given: no layer runs
    features = FeatureSet(data_dir)
    features.check_target(target)
    if val_data is not None and cfg.pilot_steps > 0 and Path(val_data).resolve() == Path(data_dir).resolve():
        # the pilot's arms refuse it (they train on it), but only after the signals' minutes
        raise LabError("--val-data is the --data path: the pilot would validate on what it trains on", val_data)
    if val_data is not None:
        held = HeldOutFeatures(Path(val_data), target, features.manifest.aux_layer_ids)
        val = held.features.read(held.items[: cfg.max_sequences])
    else:
        val = features.read(features.require("val")[: cfg.max_sequences])
    trained_for = read_config(drafter_dir)[0]
    # else a traceback from fc's matmul; another vocab size is served as engines serve it (served_with_vocab)
    check_config(replace(trained_for, target_vocab_size=target.vocab_size), target, drafter_dir)
    drafter = load_drafter(drafter_dir, target=target, device=device, vocab_size=target.vocab_size)
    aux, captured = list(drafter.config.aux_layer_ids), list(features.manifest.aux_layer_ids)
    if aux and aux != captured:  # its fc would read other layers than it was trained on, and CKA pair them
        raise LabError(f"the drafter reads aux layers {aux} (hidden_states indices), the features hold {captured}: "
                       f"capture them at the drafter's (data prepare --aux-layer-ids {','.join(map(str, aux))})",
                       drafter_dir)
    # where the two targets' tokenizers differ, an id names another token in each: compare tokens
    tokens, tokens_from = source_tokens(drafter_dir, source_target_dir, target)
    lm_head = target.lm_head_weight()

    zero = evaluate(drafter, lm_head, val, cfg.ttt_steps, cfg.batch_size, logit_map=target.logit_map)
    new_vocab = build_vocab(data_dir, drafter.config.draft_vocab_size)
    vocab = {**compare_vocabs(vocab_of_drafter(drafter), new_vocab, b_to_a=tokens),
             "drafter_target_vocab_size": trained_for.target_vocab_size,
             "by": "id" if tokens is None else "token", "source_tokenizer": tokens_from}

    home, ckas, at_home, zero_home = None, None, None, None
    if source_target_dir is not None:
        theirs, ours = _in_source_tokens(val, tokens)
        at_home = len(theirs)
        if at_home < len(val):
            log(f"probe: {at_home} of the {len(val)} held-out sequences are written wholly in tokens the source "
                "target's vocabulary has: home accept and aux CKA over those" + ("" if at_home else " (none)"))
        if theirs:
            home, ckas = _at_home(drafter_dir, source_target_dir, theirs, ours, captured, cfg, device)
            if at_home < len(val):  # the reuse ratio divides zero-shot by home over the same text
                zero_home = evaluate(drafter, lm_head, ours, cfg.ttt_steps, cfg.batch_size, logit_map=target.logit_map)

    pilot = None
    if cfg.pilot_steps > 0:
        recipe = replace(pilot_config(pilot_recipe or TrainConfig(), cfg.pilot_steps, drafter.config), device=cfg.device)
        pilot = run_pilot(drafter_dir, target_dir, data_dir, recipe, pilot_dir, transfer_lr_scale, target, val_data,
                          source_target_dir)

    verdict, reason = decide(
        (zero_home or zero)["simulated_accept_len"], home["simulated_accept_len"] if home else None, ckas, th, pilot,
        "no source target given" if source_target_dir is None else
        "no held-out sequence is written wholly in tokens the source target's vocabulary has",
    )
    if zero_home is not None and verdict == VERDICTS[0]:
        reason += f"; both over the {at_home} of {len(val)} held-out sequences the source target can read"
    return {
        "drafter": str(drafter_dir),
        "target": target.describe(),
        "source_target": str(source_target_dir) if source_target_dir else None,
        "held_out_sequences": len(val),
        "home_sequences": at_home,
        "zero_shot_home_sequences": zero_home,
        "val_data": None if val_data is None else str(val_data),
        "zero_shot": zero,
        "home": home,
        "vocab": vocab,
        "aux_cka": ckas,
        "pilot": pilot,
        "thresholds": asdict(th),
        "verdict": verdict,
        "reason": reason,
    }
