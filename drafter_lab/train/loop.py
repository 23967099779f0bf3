"""`train` and `evaluate`: the EAGLE-3 TTT training run (DESIGN section 3).

A run's output directory is an SGLang-loadable drafter (config.json + model.safetensors) with
train_state/, metrics.jsonl, run.json and, for a transfer, transfer.json beside it (and watch.json
when the watch stopped it, best/ with keep_best). Every input is checked before anything is
written, so bad input leaves no partial directory behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab import config as labconfig
from drafter_lab.data.capture_config import ENCODED_HASH, CaptureConfig, as_recorded, without
from drafter_lab.data.shards import Sequence, SequenceRef, check_token_ids
from drafter_lab.drafter.checkpoint import CONFIG, WEIGHTS, read_vocab, save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.formats import rope_scaling_from_text
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.drafter.transfer import TransferReport, check_source_target, source_tokens
from drafter_lab.drafter.transfer import init_from as transfer_init
from drafter_lab.errors import LabError
from drafter_lab.progress import console, log, maybe_progress
from drafter_lab.targets.fingerprint import recorded_name
from drafter_lab.targets.hf import check_tokenizer_dir
from drafter_lab.threads import torch_threads
from drafter_lab.train import distributed, state
from drafter_lab.train.config import (
    RESULT_FREE_FIELDS,
    UNKEYED_DEFAULTS,
    TrainConfig,
    check_config,
    check_metric,
)
from drafter_lab.train.data import (
    Batch,
    Examples,
    Prefetcher,
    collate,
    micro_batches,
    plan_epoch,
    shard_batch,
)
from drafter_lab.train.metrics import eval_counts, summarize, weighted_loss
from drafter_lab.train.metrics_log import BEST_DIR, BEST_FILE, METRICS, RUN_FILE, TRANSFER_FILE, MetricsLog
from drafter_lab.train.schedule import lr_factor
from drafter_lab.train.sources import Captured, Online
from drafter_lab.train.ttt import N_COLS, TTTObjective, loss_denominators, step_masks
from drafter_lab.train.watch import (
    WATCH_FILE,
    WatchConfig,
    comparison_note,
    judge,
    lower_is_better,
    read_run,
    stopped_at,
)

# Fields that may change between a run and its --resume without changing what it computes (a
# device or a micro-batching changes only the rounding: a run that ran out of memory resumes with
# more accumulation steps).
RESUMABLE_CHANGES = ("device", "tensorboard", "accumulation_steps", *RESULT_FREE_FIELDS)


def _autocast(device: torch.device, bf16: bool):
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _shape(cfg: TrainConfig, tc) -> tuple[int, int, int]:
    """The drafter's hidden size, heads and the head_dim that drafter_head_dim 0 stands for on target config
    `tc` (0 where heads do not divide the hidden size: no default then)."""
    hidden = cfg.drafter_hidden_size or int(tc.hidden_size)
    heads = cfg.drafter_heads or int(tc.num_attention_heads)
    if hidden % heads:
        return hidden, heads, 0
    # The target's own head_dim where its attention shape is kept (Qwen3: heads x head_dim != H).
    same_heads = hidden == int(tc.hidden_size) and heads == int(tc.num_attention_heads)
    return hidden, heads, int(getattr(tc, "head_dim", None) or hidden // heads) if same_heads else hidden // heads


def settled(cfg: TrainConfig, target_config) -> TrainConfig:
    """`cfg` with a drafter_head_dim that 0 stands for anyway recorded as 0 (UNKEYED_DEFAULTS): a run from
    before the field that --draft-config or the pilot now sets it in resumes, and one drafter is one config
    whether its head_dim was given or not."""
    if cfg.drafter_head_dim and cfg.drafter_head_dim == _shape(cfg, target_config)[2]:
        return dataclasses.replace(cfg, drafter_head_dim=0)
    return cfg


def _drafter_config(cfg: TrainConfig, target, n_draft: int, aux_ids) -> DrafterConfig:
    over = {}
    if (cfg.drafter_hidden_size or cfg.drafter_intermediate_size or cfg.drafter_heads or cfg.drafter_kv_heads
            or cfg.drafter_head_dim):
        tc = target.config
        hidden, heads, head_dim = _shape(cfg, tc)
        head_dim = cfg.drafter_head_dim or head_dim  # one given needs no hidden / heads
        kv = cfg.drafter_kv_heads or int(getattr(tc, "num_key_value_heads", None) or heads)
        if heads % kv or not head_dim:
            raise LabError(f"drafter shape: hidden {hidden} must divide by heads {heads}, heads by kv heads {kv}")
        over = dict(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            intermediate_size=cfg.drafter_intermediate_size or (
                int(tc.intermediate_size) if hidden == int(tc.hidden_size) else 4 * hidden
            ),
        )
    dcfg = DrafterConfig.for_target(target.config, n_draft, aux_ids, max_position_embeddings=max(
        cfg.max_length, int(getattr(target.config, "max_position_embeddings", 0) or 0)),
        norm_before_residual=cfg.drafter_norm_before_residual,
        rope_scaling=rope_scaling_from_text(cfg.drafter_rope_scaling, "drafter_rope_scaling"),
        **over)
    if problem := dcfg.attention_problem():  # refused now: the first step would fail
        raise LabError(f"drafter shape: {problem}")
    return dcfg


def _load_vocab(vocab, source, size: int, target_vocab: int):
    """`vocab` (a DraftVocab, or the vocab file or drafter directory to read it from), else the top `size`
    tokens of the source's train split; a refusal names where it came from (the data only when built from it)."""
    from drafter_lab.data.vocab import DraftVocab, vocab_from_counts

    where = source.where
    if vocab is None:
        vocab = vocab_from_counts(source.token_counts(), size)
    elif isinstance(vocab, (str, Path)):
        where = Path(vocab)
        vocab = read_vocab(where)  # d2t and t2d checked there, the file named
    else:  # tensors: no file to name
        where = None
    t2d = torch.as_tensor(vocab.t2d).bool()
    d2t = torch.as_tensor(vocab.d2t).long()
    if len(t2d) != target_vocab:
        raise LabError(f"draft vocab maps a {len(t2d)}-token target vocab, the target has {target_vocab}", where)
    if int(t2d.sum()) != len(d2t):
        raise LabError(f"draft vocab is inconsistent: t2d marks {int(t2d.sum())} tokens, d2t has {len(d2t)}", where)
    # else a d2t past the target vocab is an IndexError at the teacher's lm_head rows, and two ids of one token train
    DraftVocab.checked(d2t, t2d, where)
    return vocab, d2t, t2d


def _param_groups(drafter: Eagle3Drafter, transferred: set[str], cfg: TrainConfig, scale: float) -> list[dict]:
    groups: dict[tuple, list] = {}
    for name, p in drafter.named_parameters():
        if not p.requires_grad:
            continue
        key = (name in transferred, p.ndim < 2)
        groups.setdefault(key, []).append(p)
    out = []
    for (is_transferred, no_decay), params in sorted(groups.items()):
        out.append({
            "params": params,
            "lr": cfg.lr * (scale if is_transferred else 1.0),
            "weight_decay": 0.0 if no_decay else cfg.weight_decay,
        })
    return out


def _planned(cfg: TrainConfig, lengths: list[int]) -> tuple[int, int]:
    """The run's optimizer steps and the training tokens they read (sequence lengths as trained)."""
    steps = tokens = 0
    for e in range(cfg.epochs):
        for batch in plan_epoch(lengths, cfg.batch_size, cfg.batch_tokens, cfg.seed, e):
            if cfg.max_steps > 0 and steps == cfg.max_steps:
                return steps, tokens
            steps += 1
            tokens += sum(lengths[i] for i in batch)
    return steps, tokens


def _tokens_before(cfg: TrainConfig, lengths: list[int], epoch: int, cursor: int) -> int:
    """Training tokens read before batch `cursor` of `epoch`: the plan is a pure function, so a
    resumed run recounts them instead of keeping them in its state."""
    done = 0
    for e in range(epoch + 1):
        batches = plan_epoch(lengths, cfg.batch_size, cfg.batch_tokens, cfg.seed, e)
        done += sum(lengths[i] for batch in (batches if e < epoch else batches[:cursor]) for i in batch)
    return done


def _replays(val_temperature: float, sampled_at: float | None, main: bool) -> bool:
    """Whether validation replays a sampled server: only over the target's own tokens sampled at the
    validation's temperature (on re-tokenized text the replay is worse than the position average)."""
    if val_temperature <= 0:
        return False
    if sampled_at == val_temperature:
        return True
    if main:
        why = ("is not the target's own tokens (capture it with data prepare --token-exact; online, pass --token-exact)"
               if sampled_at is None else f"was sampled at temperature {sampled_at}")
        log(f"validation: no replay_accept_len_k at temperature {val_temperature}: the validation text {why}")
    return False


def _check_resume_config(saved: dict, cfg: TrainConfig, out_dir, later: tuple[str, ...] = ()) -> None:
    """Refuse a resume whose config computes another run; fields in `later`, differing alone, are left to a
    later check that names the difference better."""
    now = labconfig.to_dict(cfg)
    # a field added after the run was saved computes what the code before it did at its unkeyed default
    diff = sorted(k for k in now if k not in RESUMABLE_CHANGES and saved.get(k, UNKEYED_DEFAULTS.get(k)) != now[k])
    if set(diff) - set(later):
        raise LabError(f"--resume with a different config ({', '.join(diff)}): the run would not be the same", out_dir)


def _check_resume_vocab(saved_model: dict, d2t: torch.Tensor, out_dir) -> None:
    """The saved lm_head rows (and d2t) are the draft vocab's the run began with ((d2t, t2d, lm_head) are
    one unit; t2d follows from d2t): a resume under another loaded them while the teacher took the new
    vocab's rows, so each row trained on toward another token (one of another size was blamed on another
    lab version)."""
    before = saved_model.get("d2t")
    if before is None:  # _load_model refuses the state, naming the missing tensor
        return
    if len(before) != len(d2t):
        diff = f"d2t has {len(before)} draft ids there, {len(d2t)} now"
    else:
        moved = torch.nonzero(before != d2t).flatten()
        if not len(moved):
            return
        i = int(moved[0])
        diff = (f"d2t maps {len(moved)} of {len(d2t)} draft ids to other target tokens; draft id {i}: "
                f"target token {i + int(before[i])} there, {i + int(d2t[i])} now")
    _refuse_resume_vocab(diff, out_dir)


def _check_resume_vocab_size(saved_model: dict, size: int, target_vocab: int, out_dir) -> None:
    """A resume without a vocab builds one of the config's size: a run begun with --vocab resumed without it
    has the default size, which a target under it refuses as a size never typed, before the vocab's check."""
    if size <= target_vocab:  # built, then compared by _check_resume_vocab
        return
    before = saved_model.get("d2t")
    there = "" if before is None else f"d2t has {len(before)} draft ids there; "
    _refuse_resume_vocab(f"{there}draft_vocab_size {size} now is more than the target's {target_vocab} tokens", out_dir)


def _refuse_resume_vocab(diff: str, out_dir) -> None:
    raise LabError(f"--resume with another draft vocab ({diff}): its lm_head rows were trained for the one "
                   "it began with; give that vocab (--vocab with the run's directory reads it), or begin the run "
                   "again", out_dir)


def _check_resume_drafter(out_dir: Path, dcfg: DrafterConfig) -> None:
    """The drafter is built from the target's config, which another lab or transformers version may read
    otherwise (Gemma 3's nested RoPE base once came out 10000): a resume must build the one it saved."""
    from drafter_lab.drafter.formats import parse_config

    path = out_dir / CONFIG
    # Every checkpoint writes it before the train state: without it the run would go on unchecked, or end
    # "already finished" as a drafter nothing can load.
    missing = ("drafter config not found beside the run's train state (damaged run directory): restore it, or "
               "begin the run again")
    saved, _ = parse_config(atomic.read_json(path, missing), path)
    # the draft vocab's size is _check_resume_vocab's to name: a given vocab's, not the target config's
    diff = [f"{f.name} {getattr(saved, f.name)} there, {getattr(dcfg, f.name)} now" for f in dataclasses.fields(dcfg)
            if f.name != "draft_vocab_size" and getattr(saved, f.name) != getattr(dcfg, f.name)]
    if diff:
        raise LabError(f"--resume would build another drafter ({'; '.join(diff)}): finish the run with the version "
                       "it began with, or begin it again", out_dir)


def _check_resume_transfer(saved: dict | None, now: dict | None, out_dir) -> None:
    """A transfer's source weights, remap, L2-SP and learning-rate scale shape every step (the anchors
    and learning rates of the transferred weights): a resume needs the same. The source counts by its
    fingerprint, so a moved copy of it resumes."""
    if saved is None or now is None:
        names = [block["source"] if block else "none" for block in (saved, now)]
        diff = [] if saved is now else [f"init_from {names[0]} there, {names[1]} now"]
    else:
        diff = [f"{k} {saved.get(k, 'id' if k == 'remap_by' else None)} there, {now.get(k, 'id')} now"
                for k in {**saved, **now} if k != "source" and saved.get(k) != now.get(k)]
    if diff:
        raise LabError(f"--resume with a different transfer ({'; '.join(diff)}): the run would not be the same",
                       out_dir)


def train(cfg: TrainConfig, target_dir, data_dir, out_dir, *, resume: bool = False, init_from=None,
          remap: bool = True, l2sp: float = 0.0, transfer_lr_scale: float = 1.0, source_target=None, vocab=None,
          online: CaptureConfig | None = None, target=None, stop_if_behind=None,
          watch: WatchConfig | None = None, val_data=None) -> dict:
    """Train a drafter on `data_dir` features of `target_dir`; returns the final validation metrics.

    With `online` (capture settings; its max_length is cfg.max_length), `data_dir` is a
    conversations file instead, and the target computes each batch's states (train.sources.Online).
    Otherwise `target` may be `target_dir`'s TargetHead, loaded already (the probe's), so that it is
    not read and held twice. `val_data` validates on a set of its own instead of the data's val
    split: a feature directory captured from the same target or, online, a conversations file.

    `resume` continues the run in `out_dir` exactly (a directory without a train state starts
    fresh). `init_from` starts from another drafter (drafter.transfer rules; `remap=False` is the
    seeds' naive path), with `l2sp` pulling transferred weights toward their initial values and
    `transfer_lr_scale` scaling their learning rate; `source_target`, the target the source was trained
    for, lets the remap match tokens by string where the two tokenizers differ (default: the one the
    source's run.json names, if it is still there; refused with `remap=False`, which never reads it).
    `vocab` (a DraftVocab, or a vocab file or drafter directory to read one from) defaults to the top
    cfg.draft_vocab_size tokens of the train split.

    `stop_if_behind` (a baseline run directory, which may still be training) turns on the watch
    (train.watch, settings `watch`): after each validation the run stops, checkpointed, when it has
    fallen behind the baseline at equal steps and is not catching up.
    """
    check_config(cfg)  # before torch_threads meets cfg.threads
    # A call cannot tell its defaults from values given: the neutral ones (no pull, the rate unscaled) pass.
    check_transfer(None if l2sp == 0 else l2sp, None if transfer_lr_scale == 1 else transfer_lr_scale, remap,
                   source_target, init_from)
    val = None if val_data is None else Path(val_data)
    if val is not None and val.resolve() == Path(data_dir).resolve():  # its train split would score itself
        raise LabError("--val-data is the --data path: validation would score what the drafter trains on", val)
    _check_out(Path(out_dir), {"--target": target_dir, "--data": data_dir, "--val-data": val_data,
                               "--init-from": init_from, "--source-target": source_target})
    d = distributed.setup(cfg.device)
    with torch_threads(cfg.threads):
        def open_source() -> Captured | Online:
            if online is None:
                return Captured(Path(target_dir), Path(data_dir), cfg.scan_features, d.rank, d.world, target, val)
            return Online(Path(target_dir), Path(data_dir), dataclasses.replace(online, max_length=cfg.max_length),
                          d.device, cfg.online_val_cache_mb, val, cfg.scan_features, d.rank, d.world,
                          _rendered_before(Path(out_dir)) if resume else None)

        run = _Run(cfg, d, open_source, Path(out_dir), resume, init_from, remap, l2sp, transfer_lr_scale,
                   source_target, vocab, stop_if_behind, watch or WatchConfig())
        result = run.fit()
    d.barrier()  # every rank is done with the run's collectives before any starts what comes next
    return result


def _rendered_before(out_dir: Path) -> dict | None:
    """How the online run an --out holds rendered its conversations (its run.json's features, where they
    can be read), for a resume to render alike: the day a template that reads the clock wrote."""
    with contextlib.suppress(LabError):
        info = atomic.read_json(out_dir / RUN_FILE, "no run.json", out_dir)
        features = info.get("features") if isinstance(info, dict) else None
        return features if isinstance(features, dict) else None  # a hand-edited one: read as no record
    return None


def _val_change(out_dir: Path, had_own: bool, source) -> str:
    """What a resume changes of the run's validation set (`had_own`: a --val-data of its own, named by its
    run.json where that can be read, else the data's val split), by --val-data as given then and now."""
    before = (_rendered_before(out_dir) or {}).get("val_data") if had_own else None
    now = source.describe().get("val_data")
    if before and before == now:
        return f"--val-data {now} holds other data than when the run validated on it: the run would not be the same"
    then, cure = ((f"--val-data {before}", f"pass --val-data {before}") if before else
                  ("a --val-data of its own", "pass the --val-data it validated on") if had_own else
                  ("its data's val split", "leave --val-data out"))
    return f"the run validated on {then}; this resume gives {f'--val-data {now}' if now else 'none'}: {cure}"


_ABSENT = object()
"""A key one of two data identities lacks (a value may be None)."""


def _differences(before: dict, now: dict, within: str = "") -> list[str]:
    """Each key whose value differs between two data identities, as "key X there, Y now" (nested
    keys dotted), values shortened: the whole dicts, hashes and all, made a paragraph of the error."""
    out = []
    for k in [*before, *(k for k in now if k not in before)]:
        a, b = before.get(k, _ABSENT), now.get(k, _ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{within}{k}.")
        elif a != b:
            out.append(f"{within}{k} {_short(a)} there, {_short(b)} now")
    return out


def _short(value) -> str:
    """`value` for one line: a hash by its first 12 digits, anything else long cut to 40 characters."""
    if value is _ABSENT:
        return "absent"
    text = str(value)
    if isinstance(value, str) and len(value) > 12 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return text if len(text) <= 40 else text[:39] + "…"


def _ids_checked(read, vocab_size: int):
    """`read` (an Examples' reading), each sequence it returns checked to hold ids of the target vocab,
    on the CPU before its batch is on the device: a bad id that --scan-features false let through is a
    LabError naming its shard, not an IndexError (or a device assert) in the drafter's embedding."""
    def checked(items: list) -> list[Sequence]:
        seqs = read(items)
        for it, s in zip(items, seqs):
            check_token_ids(s.input_ids, vocab_size, it.shard if isinstance(it, SequenceRef) else None,
                            f" of sequence {s.seq_id}")
        return seqs
    return checked


def _check_out(out_dir: Path, inputs: dict) -> None:
    """Refuse an --out the run would spoil: one of its inputs (a drafter's config.json and
    model.safetensors are written there), a file, or a directory with other things in it."""
    for flag, path in inputs.items():
        if path is not None and Path(path).resolve() == out_dir.resolve():
            raise LabError(f"--out is the {flag} path: the run would overwrite it; choose another --out", out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise LabError("--out is a file: choose a directory", out_dir)
    atomic.refuse_below_file(out_dir)
    # A run makes metrics.jsonl first thing (fit), so a directory without it or a train state is not one.
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (
            (out_dir / state.STATE_DIR).exists() or (out_dir / METRICS).exists()):
        raise LabError("--out is not empty and holds no training run: choose a new or empty directory", out_dir)


def check_transfer(l2sp: float | None = None, transfer_lr_scale: float | None = None, remap: bool = True,
                   source_target=None, init_from=None) -> None:
    """Transfer settings that mean nothing (negative, NaN, infinite; any given without `init_from`, the
    source they shape; a source target with no remap to read it), refused before anything is read. None:
    not given (0 and 1)."""
    given = [flag for flag, value in (("--no-remap", None if remap else True), ("--l2sp", l2sp),
                                      ("--transfer-lr-scale", transfer_lr_scale),
                                      ("--source-target", source_target)) if value is not None]
    if given and init_from is None:  # else taken and silently ignored: there is no transferred weight
        raise LabError(f"{labconfig.listed(given)} appl{'ies' if len(given) == 1 else 'y'} with --init-from")
    l2sp, transfer_lr_scale = 0.0 if l2sp is None else l2sp, 1.0 if transfer_lr_scale is None else transfer_lr_scale
    if not 0 <= l2sp < math.inf or not 0 <= transfer_lr_scale < math.inf:  # nan and inf too
        raise LabError(f"l2sp and transfer_lr_scale must be >= 0, got {l2sp} and {transfer_lr_scale}")
    if not remap and source_target is not None:  # else taken and never read
        raise LabError("--source-target is read for the vocab remap (its tokenizer), and --no-remap turns "
                       "that off: give one or the other")


class _Run:
    """One training run: every input checked in __init__ (nothing written yet), then fit()."""

    def __init__(self, cfg: TrainConfig, d: distributed.Dist, open_source, out_dir: Path,
                 resume: bool, init_from, remap: bool, l2sp: float, transfer_lr_scale: float, source_target,
                 vocab, stop_if_behind, watch: WatchConfig):
        self.cfg, self.d, self.out_dir, self.l2sp = cfg, d, out_dir, l2sp
        self.watch, self.watch_note = None, None
        if stop_if_behind is not None:
            baseline = Path(stop_if_behind)
            if baseline.resolve() == out_dir.resolve():
                raise LabError("--stop-if-behind names the run itself; give the baseline run's directory", out_dir)
            base_rows, base_info = read_run(baseline)
            judge([], base_rows, watch, None, base_where=baseline)  # a baseline that cannot be read fails now
            self.watch = (baseline, watch)
        self.stop_reason: str | None = None
        # The metrics compared (keep_best's by check_config), checked now: the baseline may have no validation
        # yet to check the watch's against; the replay's are checked below.
        compared = {"keep_best": cfg.keep_best, "watch_metric": watch.watch_metric if self.watch else ""}
        if self.watch:
            check_metric(cfg, "watch_metric", watch.watch_metric)
        writer_cls = None
        if cfg.tensorboard and d.main:
            try:
                from torch.utils.tensorboard import SummaryWriter as writer_cls
            except ImportError:
                raise LabError("tensorboard = true needs the tensorboard package (pip install tensorboard)") from None

        # ---- every input, before anything is written ------------------------------------------
        if init_from is not None and remap and source_target is not None:
            # A wrong directory, or another model than the source's run records, refused before the features'
            # scan (minutes); both cheap (the fingerprint samples the weights).
            check_tokenizer_dir(Path(source_target))
            check_source_target(init_from, source_target)
        source = open_source()  # after the checks above: an online run loads the whole target
        target = source.target
        self.cfg = cfg = settled(cfg, target.config)  # before the resume compares it and run.json records it
        self.saved = state.load(out_dir) if resume and state.state_path(out_dir).exists() else None
        if self.saved is not None and vocab is None:
            _check_resume_vocab_size(self.saved["model"], cfg.draft_vocab_size, target.vocab_size, out_dir)
        vocab, d2t, t2d = _load_vocab(vocab, source, cfg.draft_vocab_size, target.vocab_size)
        dcfg = _drafter_config(cfg, target, len(d2t), source.aux_layer_ids)
        self.data = source.identity()
        self.replay = _replays(cfg.val_temperature, source.val_sampled_at, d.main)
        for what, name in compared.items():
            if name.startswith("replay") and not self.replay:
                raise LabError(f"{what}: {name!r} needs validation text of the target's own tokens sampled "
                               f"at {cfg.val_temperature} (data prepare --token-exact, or online --token-exact)")
        if self.saved is not None:
            # A run begun with --vocab and resumed without it differs in draft_vocab_size alone: the vocab's check
            # below says how to give it.
            _check_resume_config(self.saved["config"], cfg, out_dir, later=("draft_vocab_size",))
            saved = self.saved.get("data", self.data)  # states saved before it was kept lack it
            self.data = as_recorded(saved, self.data, out_dir)
            if saved != self.data and without(saved, [ENCODED_HASH]) == without(self.data, [ENCODED_HASH]):
                raise LabError("--resume: the same conversations now encode to other tokens or loss masks (another lab "
                               "or transformers version): finish the run with the version it began with, or begin "
                               "it again", out_dir)
            if saved != self.data:
                # An online run's encoding hash covers its validation sequences too: another set changes it.
                same_training = without(saved, ["val", ENCODED_HASH]) == without(self.data, ["val", ENCODED_HASH])
                if same_training and saved.get("val") != self.data.get("val"):
                    change = _val_change(out_dir, "val" in saved, source)
                    raise LabError(f"--resume with other validation data: {change}", out_dir)
                raise LabError(f"--resume with other training data ({'; '.join(_differences(saved, self.data))}): "
                               "the run would not be the same", out_dir)
            # after the data's check: other features hold other aux layers, and other data built another vocab
            _check_resume_drafter(out_dir, dcfg)
            _check_resume_vocab(self.saved["model"], d2t, out_dir)
            _check_resume_config(self.saved["config"], cfg, out_dir)  # a size that a given vocab overrode
        elif not resume and (state.state_path(out_dir).exists() or (out_dir / METRICS).exists()):
            raise LabError("already holds a training run: pass --resume, or choose another --out", out_dir)

        self.t2d = t2d  # on the CPU, where a step's loss counts are taken from its micro-batches
        self.drafter = drafter = _new_drafter(cfg, dcfg, target, d2t, t2d)
        self.report: TransferReport | None = None
        transfer = None
        if init_from is not None:
            tokens, found = source_tokens(init_from, source_target, target) if remap else (None, None)
            self.report = transfer_init(drafter, init_from, target, vocab, remap=remap, tokens=tokens,
                                        tokens_from=found)
            saved = (self.saved or {}).get("init_from") or {}
            transfer = {"source": str(init_from), "remap": remap,
                        "source_fingerprint": recorded_name(init_from, saved.get("source_fingerprint")),
                        "l2sp": l2sp, "transfer_lr_scale": transfer_lr_scale}
            if tokens is not None:  # absent where ids name the same tokens, as in states saved before it
                transfer["remap_by"] = "token"
        if self.saved is not None:  # states saved before it was kept lack it
            _check_resume_transfer(self.saved.get("init_from", transfer), transfer, out_dir)
        transferred = set(self.report.transferred) if self.report else set()
        self.anchors = {n: p.detach().clone() for n, p in drafter.named_parameters()
                        if n in transferred} if l2sp > 0 else {}
        lm_head = target.lm_head_weight().detach().float().to(d.device)  # one copy for top-1 and teacher
        self.train_ex, self.val_ex = (Examples(source.items[s], lm_head, cfg.max_length, d.device, source.reads[s], t,
                                               target.logit_map) for s, t in (("train", 0.0), ("val", cfg.val_temperature)))
        if empty := [s for s, ex in (("train", self.train_ex), ("val", self.val_ex)) if not ex]:  # say which, and where
            where = (source.describe().get("val_data") if empty == ["val"] else None) or source.where
            raise LabError(f"no {' or '.join(empty)} sequence has 3 or more tokens within max_length {cfg.max_length}: "
                           f"nothing to {'train' if 'train' in empty else 'validate'} on", where)
        if not cfg.scan_features:  # else the scan has checked every id
            for ex in (self.train_ex, self.val_ex):
                ex.read = _ids_checked(ex.read, target.vocab_size)

        # ---- model, optimizer, schedule -------------------------------------------------------
        dev = d.device
        drafter.to(dev)
        self.anchors = {n: a.to(dev) for n, a in self.anchors.items()}
        used = torch.arange(len(d2t)) + d2t
        self.obj = TTTObjective(drafter, lm_head[used.to(dev)], cfg.ttt_steps, cfg.loss_decay, cfg.val_temperature,
                                self.replay, target.logit_map)
        self.model = self.obj
        if d.active:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.obj, device_ids=[dev.index] if dev.type == "cuda" else None)
        self.optim = torch.optim.AdamW(_param_groups(drafter, transferred, cfg, transfer_lr_scale), lr=cfg.lr,
                                       betas=(0.9, cfg.adam_beta2))
        self.lengths = self.train_ex.lengths
        total, self.total_tokens = _planned(cfg, self.lengths)
        self.total = total
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lambda s: lr_factor(s, cfg.warmup_steps, total, cfg.min_lr_ratio))
        self.metrics = MetricsLog(out_dir / METRICS, enabled=d.main)
        self.autocast = _autocast(dev, cfg.bf16)
        self.step = self.epoch = self.cursor = self.tokens = 0
        self.log_counts = torch.zeros(cfg.ttt_steps, N_COLS, dtype=torch.float64, device=dev)
        # This rank's first step whose loss or gradient norm was not finite (0: none yet), with the two values.
        self.nonfinite = torch.zeros(3, dtype=torch.float64, device=dev)
        self.kept_step: int | None = None  # the step of the train state on disk
        self.last_val: dict | None = None
        self.best: dict | None = None  # keep_best's validation so far: metric, value, step, epoch
        self.info = {
            "config": labconfig.to_dict(cfg),
            "drafter": dataclasses.asdict(dcfg),
            "target": target.describe(),
            "features": {**source.describe(), **self.data, "train_sequences": len(self.train_ex), "val_sequences": len(self.val_ex)},
            "init_from": transfer,
            "total_steps": total,
            "total_tokens": self.total_tokens,
            "world_size": d.world,
            "own_embedding": dcfg.own_embedding,
        }
        if self.watch:
            self.watch_note = comparison_note(self.info, base_info, watch.watch_axis)
        self.writer_cls = writer_cls
        self.t0 = time.time()

    # ---- bookkeeping ----------------------------------------------------------------------------
    def restore(self) -> None:
        s = self.saved
        self.rank0_writes("resuming the run", (self.out_dir, lambda: self.tidy(s)))
        if s is None:
            return
        _load_model(self.drafter, s["model"], state.state_path(self.out_dir))
        self.optim.load_state_dict(s["optimizer"])
        self.sched.load_state_dict(s["scheduler"])
        self.step, self.epoch, self.cursor = s["step"], s["epoch"], s["cursor"]
        self.kept_step = self.step
        self.tokens = _tokens_before(self.cfg, self.lengths, self.epoch, self.cursor)
        if self.d.main:  # the counts of every rank since the last train line; the others add theirs from zero
            saved = s["log_counts"]  # a state saved before the sampled columns existed has fewer
            self.log_counts[:, :saved.shape[1]] = saved.to(self.d.device)
        self.last_val = s.get("last_val")
        self.best = _kept_best(self.out_dir, self.cfg.keep_best)
        self.t0 = time.time() - s.get("elapsed_s", 0.0)  # the clock goes on from the checkpoint's (older states lack it)
        state.set_rng_state(s["rng"])

    def tidy(self, saved: dict | None) -> None:
        """Rank 0's, before a run goes on: a killed write leaves its temp (a drafter's or a train state's
        size), and a run killed during its final save resumes finished, writing nothing that would clear
        them; metrics.jsonl is cut back to the train state's (without one, a killed first attempt's lines go)."""
        names = (BEST_DIR, WEIGHTS, CONFIG, RUN_FILE, TRANSFER_FILE, WATCH_FILE)  # a resume may write some never again
        for path in (*(self.out_dir / n for n in names), state.state_path(self.out_dir)):
            atomic.clear_stale_temps(path)
        self.metrics.truncate(0 if saved is None else saved["metrics_bytes"])

    def log_train(self) -> dict:
        """A train line: every rank's counts since the last one, summed, written by rank 0."""
        c = self.cfg
        self.check_finite()  # no train line of a diverged run
        m = summarize(self.d.sum(self.log_counts))
        m["weighted_loss"] = weighted_loss(m, c.ttt_steps, c.loss_decay)
        self.rank0_writes("a train line", (self.out_dir / METRICS, lambda: self.record("train", m)))
        self.log_counts.zero_()
        return m

    def record(self, event: str, values: dict) -> None:
        c = self.cfg
        # the last step's rate for weights trained from scratch; transferred ones ran at transfer_lr_scale x it
        lr = c.lr * lr_factor(max(self.step - 1, 0), c.warmup_steps, self.total, c.min_lr_ratio)
        row = {"event": event, "split": "val" if event == "val" else "train", "step": self.step,
               "epoch": self.epoch, "train_tokens": self.tokens, "lr": lr, "elapsed_s": round(time.time() - self.t0, 3), **values}
        self.metrics.write(row)
        if self.tb:
            for k, v in values.items():
                if isinstance(v, float):
                    self.tb.add_scalar(f"{row['split']}/{k}", v, self.step)

    def validate(self) -> None:
        """One validation, its line, best/ and the watch; fit reads it back from last_val."""
        self.check_finite()  # before best/ or the watch sees a diverged drafter
        self.drafter.eval()
        m = summarize(eval_counts(self.obj, self.val_ex, self.cfg.eval_batch_size, self.d, self.autocast),
                      self.cfg.val_temperature > 0, self.replay)
        self.drafter.train()
        m["weighted_loss"] = weighted_loss(m, self.cfg.ttt_steps, self.cfg.loss_decay)
        self.last_val = {"step": self.step, "epoch": self.epoch, **m}
        self.rank0_writes("the validation", (self.out_dir / METRICS, lambda: self.record("val", m)),
                          (self.out_dir / BEST_DIR, lambda: self.keep_if_best(m)))
        if self.watch and self.step < self.total:
            self.check_watch()

    def keep_if_best(self, m: dict) -> None:
        """With keep_best, a validation better than every one before it puts the drafter in
        <out>/best, whole. One that scored no position measured nothing (its accuracies read 0), so it is not one."""
        name = self.cfg.keep_best
        if not name or not self.d.main or math.isnan(m[name]) or m.get("positions") == 0:
            return
        if self.best is not None:
            gain = m[name] - self.best["value"]
            if (-gain if lower_is_better(name) else gain) <= 0:  # a tie keeps the earlier drafter
                return
        self.best = {"metric": name, "value": m[name], "step": self.step, "epoch": self.epoch}
        with atomic.atomic_dir(self.out_dir / BEST_DIR) as tmp:
            save_drafter(self.drafter, tmp)
            atomic.write_json(tmp / RUN_FILE, self.info)  # its target fingerprint, for eval's pairing check
            atomic.write_json(tmp / BEST_FILE, {**self.best, "validation": m})

    def check_watch(self) -> None:
        """Rank 0 judges (it holds metrics.jsonl, and the baseline may still be growing); every rank
        learns the answer, so all stop at the same step. A baseline that cannot be read (cut, removed
        mid-run), a verdict that cannot be written (disk full) or any other exception on rank 0 fails
        every rank (rank0)."""
        baseline, wcfg = self.watch

        def judge_here() -> float:  # 1: stop
            total = self.total if wcfg.watch_axis == "step" else self.total_tokens
            # read_run, not read_metrics: an OSError is a LabError there
            verdict = judge(read_run(self.out_dir)[0], read_run(baseline)[0], wcfg, total, self.out_dir, baseline)
            if not verdict.stop:
                return 0.0
            self.stop_reason = verdict.reason
            path = self.out_dir / WATCH_FILE
            try:
                atomic.write_json(path, {"step": self.step, "total_steps": self.total, "baseline": str(baseline),
                                         "config": dataclasses.asdict(wcfg), **verdict.to_json()})
            except OSError as e:  # disk full, permissions
                raise LabError(f"the watch's verdict cannot be written ({e.strerror or e})", path) from None
            return 1.0

        if self.rank0("the watch", judge_here) > 0 and self.stop_reason is None:
            self.stop_reason = "stopped by the watch on rank 0"

    def rank0(self, what: str, work) -> float:
        """`work()` (a number >= 0, what the other ranks learn) run on rank 0 alone; every rank gets its
        number, or fails with it: a rank left behind would wait in the next collective for ever (NCCL:
        until its timeout). Rank 0 raises the exception itself, its traceback kept if not a LabError."""
        said, failed = 0.0, None
        if self.d.main:
            try:
                said = float(work())
            except Exception as e:
                said, failed = -1.0, e
        said = self.d.sum(torch.full((), said, device=self.d.device)).item()  # rank 0's alone
        if failed is not None:
            raise failed
        if said < 0:
            raise LabError(f"{what} failed on rank 0 at step {self.step} (its error is in rank 0's output)",
                           self.out_dir)
        return said

    def rank0_writes(self, what: str, *writes) -> None:
        """Each `(path, write)` called in turn on rank 0 alone (rank0); an OSError (disk full,
        permissions) is a LabError naming `path`."""
        def write_all() -> float:
            for path, write in writes:
                try:
                    write()
                except OSError as e:
                    raise LabError(f"cannot be written ({e.strerror or e})", path) from None
            return 0.0

        self.rank0(what, write_all)

    def check_finite(self) -> None:
        """Stop a diverged run before it writes its weights: called where the loop reads the device
        anyway (a train line, a validation, a checkpoint), so the steps in between cost no host sync.
        Every rank joins the sum and learns the first non-finite step of any rank, so all stop together
        and the train state on disk stays the last finite one, for --resume."""
        seen = torch.zeros(self.d.world, 3, dtype=torch.float64, device=self.d.device)
        seen[self.d.rank] = self.nonfinite
        seen = self.d.sum(seen).cpu()
        seen = seen[seen[:, 0] > 0]
        if not len(seen):
            return
        first = seen[seen[:, 0] == seen[:, 0].min()]
        # A rank's NaN loss reaches every rank's gradient norm through the all-reduce at that same step: the
        # loss is the cause, whichever rank saw it
        lost = first[~torch.isfinite(first[:, 1])]
        step, loss, norm = (lost if len(lost) else first)[0].tolist()
        what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {norm}"
        kept = ("no checkpoint was written" if self.kept_step is None
                else f"the last checkpoint, step {self.kept_step}, is kept")
        cure = "lower --lr" + ("" if self.cfg.grad_clip > 0 else ", or set --grad-clip")
        raise LabError(f"{what} at step {int(step)}: the run diverged ({cure}); {kept}", self.out_dir)

    def checkpoint(self) -> None:
        self.check_finite()
        log_counts = self.d.sum(self.log_counts)  # every rank's share of the next train line
        self.rank0_writes("the checkpoint", (self.out_dir, lambda: save_drafter(self.drafter, self.out_dir)),
                          (state.state_path(self.out_dir), lambda: self.save_state(log_counts)))
        self.kept_step = self.step

    def save_state(self, log_counts: torch.Tensor) -> None:
        state.save(self.out_dir, {
            "config": labconfig.to_dict(self.cfg),
            "data": self.data,
            "init_from": self.info["init_from"],
            "model": {k: v for k, v in self.drafter.state_dict().items()
                      if k != "embed_tokens.weight" or self.drafter.config.own_embedding},
            "optimizer": self.optim.state_dict(),
            "scheduler": self.sched.state_dict(),
            "step": self.step, "epoch": self.epoch, "cursor": self.cursor,
            "log_counts": log_counts.cpu(),
            "last_val": self.last_val,
            "metrics_bytes": self.metrics.sync_size(),
            "elapsed_s": time.time() - self.t0,
            "rng": state.rng_state(),
        })

    def start_files(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / METRICS).touch()  # first: it marks the directory a run's (_check_out)
        if self.report is not None:
            console.print(self.report.table())
            atomic.write_json(self.out_dir / TRANSFER_FILE, self.report.to_json())
        atomic.write_json(self.out_dir / RUN_FILE, self.info)
        # Resumed, the steps after the checkpoint are logged again: purge the killed attempt's events of them
        # (metrics.jsonl is cut back the same way), or TensorBoard draws both; without a checkpoint, all of them.
        tb_dir = self.out_dir / "tensorboard"
        purge = ({"purge_step": self.step + 1} if self.saved is not None else
                 {"purge_step": 0} if tb_dir.exists() else {})
        self.tb = self.writer_cls(str(tb_dir), **purge) if self.writer_cls else None

    # ---- training -------------------------------------------------------------------------------
    def load_batch(self, rows: list[int]) -> list[Batch]:
        """This rank's share of global batch `rows` as its micro-batches, collated on the CPU
        (pinned for a GPU); an online run's target computes them one at a time too."""
        mine = shard_batch(rows, self.d.rank, self.d.world) or rows[:1]  # a rank without rows computes on a stand-in
        cut = micro_batches(mine, self.lengths, self.cfg.accumulation_steps)
        parts = [collate(self.train_ex.take(part)) for part in cut]
        return [b.pin() for b in parts] if self.d.device.type == "cuda" else parts

    def train_step(self, rows: list[int], parts: list[Batch]) -> None:
        """One optimizer step on global batch `rows`, whose share for this rank is the micro-batches
        `parts`: their gradients are added up, and only one of them is on the device at a time."""
        c, d = self.cfg, self.d
        weight = 1.0 if shard_batch(rows, d.rank, d.world) else 0.0  # a rank without rows still joins the all-reduce
        # Loss = sum over the GLOBAL batch / global counts: DDP's gradient mean times world size.
        # Every micro-batch divides by the whole step's counts, so their gradients sum to the batch's.
        den = sum(loss_denominators(*step_masks(b, self.t2d, c.ttt_steps)) for b in parts)
        den = d.sum(den.to(d.device) * weight)
        self.optim.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=d.device)  # this rank's share of the step's loss
        for j, batch in enumerate(parts):
            last = j == len(parts) - 1
            # DDP all-reduces the summed gradients in the last backward only.
            with self.model.no_sync() if d.active and not last else contextlib.nullcontext():
                with self.autocast:
                    loss, counts = self.model(batch.to(d.device), den, d.world * weight)
                if self.anchors and last:
                    loss = loss + self.l2sp * sum(((p - self.anchors[n]) ** 2).sum()
                                                  for n, p in self.drafter.named_parameters() if n in self.anchors)
                loss.backward()
            total += loss.detach()
            self.log_counts += counts * weight
        # Without a clip the norm is still taken (an inf max_norm scales by 1.0): a backward can overflow under a
        # finite loss, and the step would make the weights NaN unseen until after the next checkpoint wrote them.
        norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), c.grad_clip if c.grad_clip > 0 else math.inf)
        # Noted on the device, read by check_finite before anything is written.
        seen = torch.stack([total, norm.to(total)])
        first = (self.nonfinite[0] == 0) & ~seen.isfinite().all()
        self.nonfinite = torch.where(first, torch.cat([seen.new_full((1,), self.step + 1), seen]), self.nonfinite)
        self.optim.step()
        self.sched.step()
        self.step += 1
        self.cursor += 1
        self.tokens += sum(self.lengths[i] for i in rows)

    def fit(self) -> dict:
        c, d = self.cfg, self.d
        self.restore()
        if self.step == self.total and self.last_val is not None and self.last_val["step"] == self.step:
            # A finished run: its last checkpoint holds the final validation, so nothing is rewritten.
            if d.main:
                log(f"already finished ({self.step} steps): {self.out_dir}")
            return self.last_val
        if self.watch and self.last_val is not None and stopped_at(self.out_dir) == self.step:
            if d.main:
                log(f"stopped by the watch at step {self.step} ({self.out_dir / WATCH_FILE}); resume without "
                    "--stop-if-behind to train on")
            return self.last_val
        self.tb = None
        self.rank0_writes("starting the run", (self.out_dir, self.start_files))
        if self.watch and self.watch_note and d.main:
            log(f"[yellow]watch:[/] {self.watch_note}")
        self.drafter.train()
        if c.eval_at_start and self.step == 0:
            self.validate()
        prefetch = Prefetcher(self.load_batch)
        with maybe_progress("train", self.total, d.main) as advance, contextlib.closing(prefetch):
            advance(self.step)
            while self.step < self.total and self.stop_reason is None:
                batches = plan_epoch(self.lengths, c.batch_size, c.batch_tokens, c.seed, self.epoch)
                while self.cursor < len(batches) and self.step < self.total and self.stop_reason is None:
                    i = self.cursor
                    last = i + 1 == len(batches) or self.step + 1 == self.total
                    ahead = c.prefetch and not last
                    nxt = ((self.epoch, i + 1), batches[i + 1]) if ahead else None  # loaded during this step
                    self.train_step(batches[i], prefetch.get((self.epoch, i), batches[i], nxt))
                    if self.step % c.log_every == 0 or self.step == self.total:
                        m = self.log_train()
                        advance(0, loss0=m["loss_0"], acc0=m["cond_acc_0"],
                                acc1=m["cond_acc_1"] if c.ttt_steps > 1 else 0.0)
                    advance(1)
                    if c.eval_every and self.step % c.eval_every == 0 and self.cursor < len(batches):
                        self.validate()
                    if c.checkpoint_every and self.step % c.checkpoint_every == 0:
                        self.checkpoint()
                if self.cursor >= len(batches):  # epoch end: validate, then the state of the next epoch
                    self.validate()
                    self.epoch += 1
                    self.cursor = 0
                    self.checkpoint()
        if self.last_val is None or self.last_val["step"] != self.step:
            self.validate()
        self.checkpoint()
        if self.tb:
            self.tb.close()
        v = self.last_val
        if d.main and self.stop_reason is not None:
            log(f"[bold]the watch stopped the run[/] at step {self.step} of {self.total}: {self.stop_reason}")
        if d.main:
            if v["positions"]:
                scored = (f"val cond_acc_0={v['cond_acc_0']:.3f}"
                          + (f" cond_acc_1={v['cond_acc_1']:.3f}" if c.ttt_steps > 1 else "")
                          + f" simulated_accept_len={v['simulated_accept_len']:.3f}")
            else:  # its zero accuracies would measure nothing
                scored = ("validation scored no position (no val sequence has an assistant token past its first two "
                          f"within max_length {c.max_length})")
            log(f"trained {self.step} steps in {time.time() - self.t0:.0f}s: {scored} -> {self.out_dir}")
            if self.best is not None:
                b = self.best
                log(f"best {b['metric']}={b['value']:.4g} at step {b['step']} -> {self.out_dir / BEST_DIR}")
        return v


def _kept_best(out_dir: Path, metric: str) -> dict | None:
    """The record of the drafter kept in <out>/best, if it was kept by `metric`. A resume continues
    from it even when a killed attempt wrote it after the last checkpoint: its weights are the ones
    that validation measured, and a replay of that validation would write the same."""
    path = out_dir / BEST_DIR / BEST_FILE
    if not metric or not path.exists():
        return None
    kept = atomic.read_json(path, "")
    value, step = (kept.get("value"), kept.get("step")) if isinstance(kept, dict) else (None, None)
    # each validation is compared with the value, and the run's last line names the step: one missing or not a
    # number fails later, as a traceback or a "step True" (JSON true and false are ints to Python)
    if (not isinstance(kept, dict) or isinstance(step, bool) or not isinstance(step, int) or isinstance(value, bool)
            or not isinstance(value, (int, float))):
        raise LabError("not the record of a kept drafter (a JSON object with its step and value)", path)
    return kept if kept.get("metric") == metric else None


def _new_drafter(cfg: TrainConfig, dcfg: DrafterConfig, target, d2t, t2d) -> Eagle3Drafter:
    """Seeded init; the target's frozen embedding (or, if H != H_target, an own trainable one)."""
    torch.manual_seed(cfg.seed)
    drafter = Eagle3Drafter(dcfg)
    with torch.no_grad():
        if dcfg.own_embedding:  # the target's embedding has the wrong width: the drafter learns its own
            drafter.embed_tokens.weight.normal_(0.0, 0.02)
            drafter.embed_tokens.weight.requires_grad_(True)
        else:
            drafter.embed_tokens.weight.copy_(target.embed_weight())
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
        if cfg.init_lm_head_from_target:
            if dcfg.own_embedding:
                raise LabError(f"init_lm_head_from_target needs the drafter hidden size ({dcfg.hidden_size}) to "
                               f"equal the target's ({dcfg.target_hidden_size})")
            drafter.lm_head.weight.copy_(target.lm_head_weight()[torch.arange(len(d2t)) + d2t])
    return drafter


def _embed_frozen(drafter: Eagle3Drafter) -> bool:
    return not drafter.embed_tokens.weight.requires_grad


def _load_model(drafter: Eagle3Drafter, model_state: dict, where) -> None:
    """Load saved weights (of train state file `where`); a frozen (target-owned) embedding is not in the state
    and stays as built."""
    own = drafter.state_dict()

    def shape(v) -> list[int] | str:
        return list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__

    # load_state_dict, strict or not, fails a value of another shape with a many-line RuntimeError
    bad = [f"{k} {shape(v)}, not {shape(own[k])}" for k, v in model_state.items()
           if k in own and shape(v) != shape(own[k])]
    if not bad:
        missing, unexpected = drafter.load_state_dict(model_state, strict=False)
        bad = [k for k in missing if not (k == "embed_tokens.weight" and _embed_frozen(drafter))] + list(unexpected)
    if bad:
        raise LabError(f"train state does not fit the drafter ({', '.join(bad)})", where)
