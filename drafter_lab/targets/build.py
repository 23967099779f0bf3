"""Build the offline target pair: `base` ("K2") trained from scratch, `tuned` ("K2.5") fine-tuned.

Stages and caching. Each stage lands in a cache directory named by a hash of what it depends on,
built in a temp directory and renamed into place, so a killed build leaves nothing half-written:

- `base-<key>`: tokenizer + base model + held-out prompt files + drift inputs; the key covers the
  config without its fine-tune fields, the corpus content hash, CODE_VERSION and the device type.
- `tuned-<key>`: the fine-tuned model + its drift figures; the key adds the fine-tune fields and
  `drift`, so a drift sweep retrains only `tuned`.

Each entry's build.json records its model's fingerprint and the sha256 of every other file (`_record`);
an entry that no longer matches it (a file deleted or cut short since: a full disk, an `rm`), or a
`tuned` fine-tuned from another build of `base`, is said in one line and rebuilt, not copied on.

`out_dir` then gets copies (`base/`, `tuned/`, `prompts-train.jsonl`, `prompts-eval.jsonl`) and
`pair.json`, which records the same of them; when its `pair.json` already names the same key and
`out_dir` still matches it, `build_pair` returns at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import torch

from drafter_lab.atomic import (
    atomic_dir,
    nan_for_null,
    refuse_below_file,
    save_safetensors,
    sha256_file,
    sha256_json,
    write_json,
)
from drafter_lab.errors import LabError
from drafter_lab.locks import building
from drafter_lab.progress import log
from drafter_lab.targets import corpus as corpus_mod
from drafter_lab.targets.drift import measure_drift
from drafter_lab.targets.fingerprint import fingerprint, weight_files
from drafter_lab.targets.hf import default_aux_layer_ids, quiet_transformers, resolve_device
from drafter_lab.targets.presets import PRESETS, TargetConfig, resolve
from drafter_lab.targets.tokenizer import train_bpe
from drafter_lab.targets.train_lm import encode_conversations, train_lm
from drafter_lab.threads import torch_threads

__all__ = ["CODE_VERSION", "PRESETS", "TargetConfig", "build_pair", "default_cache_dir"]

# Bump when training or saving changes, so old cache entries are not reused.
CODE_VERSION = 1
PAIR_FORMAT = 1
DRIFT_BATCH = 8


def default_cache_dir() -> Path:
    """$DRAFTER_LAB_CACHE/targets, else ~/.cache/drafter_lab/targets."""
    root = os.environ.get("DRAFTER_LAB_CACHE") or Path.home() / ".cache" / "drafter_lab"
    return Path(root) / "targets"


def _llama(cfg: TargetConfig, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_position_embeddings,
            bos_token_id=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            tie_word_embeddings=False,
        )
    )


def _interleave(a: list, b: list) -> list:
    out = []
    for x, y in zip(a, b):
        out += [x, y]
    return out


def _heldout_split(cfg: TargetConfig, corpus) -> dict[str, list]:
    """Disjoint held-out parts: eval prompts, then drift inputs, then train prompts, per slice."""
    e, t, d = (cfg.eval_prompts + 1) // 2, (cfg.train_prompts + 1) // 2, cfg.drift_conversations
    hb, hs = corpus.heldout_base, corpus.heldout_shifted
    return {
        "eval": _interleave(hb[:e], hs[:e])[: cfg.eval_prompts],
        "drift_base": hb[e : e + d],
        "drift_shifted": hs[e : e + d],
        "train": _interleave(hb[e + d : e + d + t], hs[e + d : e + d + t])[: cfg.train_prompts],
    }


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text(
        "".join(
            json.dumps({"id": r["id"], "slice": r["slice"], "conversations": r["conversations"]}) + "\n"
            for r in records
        )
    )


def _file_hashes(root: Path, models: tuple[str, ...]) -> dict[str, str]:
    """sha256 of each file below `root` but the weights of its `models`, which their fingerprints cover:
    what is left (tokenizer, configs, prompts, drift inputs) is small, and the fingerprint leaves it out."""
    weights = {f for m in models for f in weight_files(root / m)}
    return {f.relative_to(root).as_posix(): sha256_file(f) for f in sorted(root.rglob("*"))
            if f.is_file() and f not in weights}


def _record(stage: Path) -> dict:
    """What a cache entry is checked against before it is reused (`_mismatch`)."""
    return {"fingerprint": fingerprint(stage / "model"), "files": _file_hashes(stage, ("model",))}


def _mismatch(root: Path, files: dict, fingerprints: dict) -> str | None:
    """How `root` differs from what was recorded of it, else None."""
    for name, digest in files.items():
        try:
            if sha256_file(root / name) != digest:
                return f"{name} has changed"
        except OSError:
            return f"{name} is missing or unreadable"
    for model, recorded in fingerprints.items():
        try:
            if fingerprint(root / model) != recorded:
                return f"the weights in {model}/ have changed"
        except LabError as e:
            return str(e)
    return None


def _read_record(path: Path) -> dict:
    """A build.json or pair.json. Its drift figures' nulls are CKAs of no variance, NaN when measured
    (write_json keeps to strict JSON): they read as NaN again, for the tables and the report."""
    info = json.loads(path.read_text())
    if isinstance(info, dict) and isinstance(info.get("drift_figures"), dict):
        info["drift_figures"] = nan_for_null(info["drift_figures"])
    return info


def _cached_stage(stage: Path, what: str, base_fingerprint: str | None = None) -> dict | None:
    """The build.json of cache entry `stage` when the entry still holds what that records (and, for
    `tuned`, was fine-tuned from the base of `base_fingerprint`); else None, said in one line, to rebuild it."""
    if not (stage / "build.json").exists():
        return None
    try:
        info = _read_record(stage / "build.json")
        why = _mismatch(stage, info["files"], {"model": info["fingerprint"]})
        if why is None and base_fingerprint is not None and info["base_fingerprint"] != base_fingerprint:
            why = "fine-tuned from another build of base"
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        why = "its build.json is unreadable, or from an older drafter_lab"
    if why is not None:
        log(f"{what}: rebuilding the cache entry {stage}: {why}")
        return None
    log(f"{what}: cached ({stage})")
    return info


class _Corpus:
    """The corpus, parsed only when a stage actually has to train."""

    def __init__(self, cfg: TargetConfig, files: list[Path], content_hash: str):
        self.cfg, self.files, self.hash, self._value, self.seconds = cfg, files, content_hash, None, 0.0

    def get(self):
        if self._value is None:
            start = time.perf_counter()
            log(f"corpus: {len(self.files)} files of {corpus_mod.SNAPSHOT.name} -> conversations")
            self._value = corpus_mod.build_corpus(
                self.files,
                seed=self.cfg.seed,
                shifted_share=self.cfg.shifted_share,
                heldout_per_slice=self.cfg.heldout_per_slice,
                max_source_chars=self.cfg.max_source_chars,
                content_hash=self.hash,
            )
            self.seconds = round(time.perf_counter() - start, 2)
        return self._value


def _build_base(cfg: TargetConfig, corpus: _Corpus, key: str, dest: Path, device: torch.device) -> None:
    c = corpus.get()
    with atomic_dir(dest) as tmp:
        start = time.perf_counter()
        log(f"tokenizer: byte-level BPE, vocab {cfg.vocab_size}")
        tok = train_bpe(
            (m["content"] for r in c.base + c.shifted for m in r["conversations"]), cfg.vocab_size
        )
        tok_seconds = round(time.perf_counter() - start, 2)
        if len(tok) < cfg.vocab_size:  # else a smaller model than asked, under a config that names vocab_size
            raise LabError(f"vocab_size {cfg.vocab_size}: this corpus yields only {len(tok)} tokens; "
                           f"lower vocab_size or raise corpus_max_files")
        split = _heldout_split(cfg, c)
        drift_inputs = {side: encode_conversations(tok, split[f"drift_{side}"]).windows(cfg.seq_len)
                        for side in ("base", "shifted")}
        for side, windows in drift_inputs.items():  # checked before training: no drift is measured on nothing
            if not len(windows):
                raise LabError(f"the {cfg.drift_conversations} held-out {side} conversation(s) for drift "
                               f"hold fewer than seq_len {cfg.seq_len} tokens; raise drift_conversations")
        model = _llama(cfg, tok).to(device)
        stats = train_lm(
            model,
            [(encode_conversations(tok, c.base), 1.0)],
            steps=cfg.base_steps,
            batch_size=cfg.batch_size,
            seq_len=cfg.seq_len,
            lr=cfg.base_lr,
            warmup_steps=cfg.warmup_steps,
            weight_decay=cfg.weight_decay,
            decay=True,
            seed=cfg.seed,
            description="train base",
        )
        with quiet_transformers():
            model.cpu().save_pretrained(tmp / "model")
            tok.save_pretrained(tmp / "model")
        _write_jsonl(tmp / "prompts-train.jsonl", split["train"])
        _write_jsonl(tmp / "prompts-eval.jsonl", split["eval"])
        save_safetensors(drift_inputs, tmp / "drift-inputs.safetensors")
        record = _record(tmp)
        write_json(
            tmp / "build.json",
            {
                "key": key,
                "corpus": c.summary(),
                "params": sum(p.numel() for p in model.parameters()),
                "train": stats,
                "seconds": {"corpus": corpus.seconds, "tokenizer": tok_seconds, "base": stats["seconds"]},
                "prompts": {"train": len(split["train"]), "eval": len(split["eval"])},
                **record,
            },
        )


def _drift_figures(base_model, tuned_model, inputs: dict[str, torch.Tensor]) -> dict:
    def batches(windows):
        return list(windows.split(DRIFT_BATCH))

    both = torch.cat([inputs["base"], inputs["shifted"]])
    return {
        "all": measure_drift(base_model, tuned_model, batches(both)),
        "base_text": measure_drift(base_model, tuned_model, batches(inputs["base"])),
        "shifted_text": measure_drift(base_model, tuned_model, batches(inputs["shifted"])),
    }


def _build_tuned(
    cfg: TargetConfig, corpus: _Corpus, base_dir: Path, base_fingerprint: str, key: str, dest: Path, device
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    steps = round(cfg.drift * cfg.tune_steps)
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(base_dir / "model"))
        base = (
            LlamaForCausalLM.from_pretrained(str(base_dir / "model"), dtype=torch.float32).to(device).eval()
        )
        tuned = LlamaForCausalLM.from_pretrained(str(base_dir / "model"), dtype=torch.float32).to(device)
    stats = {"steps": 0, "tokens": 0, "first_loss": None, "final_loss": None, "seconds": 0.0}
    if steps:
        c = corpus.get()
        f = cfg.tune_shifted_fraction
        stats = train_lm(
            tuned,
            [(encode_conversations(tok, c.shifted), f), (encode_conversations(tok, c.base), 1.0 - f)],
            steps=steps,
            batch_size=cfg.batch_size,
            seq_len=cfg.seq_len,
            lr=cfg.tune_lr,
            warmup_steps=min(cfg.warmup_steps, cfg.tune_steps),
            weight_decay=cfg.weight_decay,
            decay=False,
            seed=cfg.seed + 1,
            description=f"fine-tune tuned (drift {cfg.drift:g})",
        )
    tuned.eval()
    start = time.perf_counter()
    log("drift: CKA per layer and KL(base || tuned) on held-out text")
    figures = _drift_figures(base, tuned, load_file(str(base_dir / "drift-inputs.safetensors")))
    drift_seconds = round(time.perf_counter() - start, 2)
    with atomic_dir(dest) as tmp, quiet_transformers():
        tuned.cpu().save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")
        write_json(
            tmp / "build.json",
            {
                "key": key,
                "train": stats,
                "drift_figures": figures,
                "seconds": {"tuned": stats["seconds"], "drift": drift_seconds},
                "base_fingerprint": base_fingerprint,
                **_record(tmp),
            },
        )


def _check_out_dir(out_dir: Path, cache: Path) -> None:
    """`out_dir` is replaced whole, so it must be new, empty, or an earlier pair, and hold no cache."""
    refuse_below_file(out_dir)  # refused before the work, not when the pair is written
    if cache.resolve().is_relative_to(out_dir.resolve()):  # replacing out_dir would delete the cache
        raise LabError(f"holds the cache dir {cache}, and each build replaces it whole; "
                       f"put the cache elsewhere", out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise LabError("exists and is not a directory", out_dir)
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "pair.json").exists():
        raise LabError(
            "exists and is not a target-pair directory (no pair.json); refusing to replace it", out_dir
        )


def _copy_into(out_dir: Path, base_dir: Path, tuned_dir: Path, pair: dict) -> None:
    with atomic_dir(out_dir) as tmp:
        shutil.copytree(base_dir / "model", tmp / "base")
        shutil.copytree(tuned_dir / "model", tmp / "tuned")
        for name in ("prompts-train.jsonl", "prompts-eval.jsonl"):
            shutil.copy2(base_dir / name, tmp / name)
        pair["files"] = _file_hashes(tmp, ("base", "tuned"))
        write_json(tmp / "pair.json", pair)
        _usual_permissions(tmp)


def _usual_permissions(root: Path) -> None:
    """Temp files and dirs are created private (0600/0700); give the pair the umask's modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _cached_pair(out_dir: Path, key: str) -> dict | None:
    """out_dir's pair.json if it names `key` and out_dir still holds what it records: both models'
    fingerprints and the sha256 of every other file (a pair.json of another shape, or a model, tokenizer
    or prompt file edited or deleted since, is copied again, not reused)."""
    try:
        pair = _read_record(out_dir / "pair.json")
        if pair.get("key") != key or not isinstance(pair["build_seconds"], dict):
            return None
        why = _mismatch(out_dir, pair["files"], {side: pair[side]["fingerprint"] for side in ("base", "tuned")})
        if why is not None:
            log(f"{out_dir}: {why}; copying the pair again")
            return None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None
    return pair


def _seconds_spent(info: dict, cached: bool) -> dict:
    """The seconds of each part of a stage (its build.json's) spent by this call: none when it was cached."""
    return {part: 0.0 if cached else seconds for part, seconds in info["seconds"].items()}


def build_pair(
    preset_or_config, out_dir, drift: float | None = None, force: bool = False, cache_dir=None
) -> dict:
    """Build (or fetch from cache) the target pair into `out_dir`; returns the pair.json content.

    `preset_or_config`: a preset name (see PRESETS) or a TargetConfig. `drift` overrides the
    config's drift. `force` retrains both stages even when cached. `cache_dir` defaults to
    `default_cache_dir()`. `build_seconds` holds what this call spent (in pair.json, the call that wrote
    it) on each stage, 0 on one taken from the cache (its `cached` says so; its `train.seconds` stays its
    own build's), and in `this_call` in all.
    """
    begin = time.perf_counter()
    cfg = resolve(preset_or_config)
    preset = next((name for name, known in PRESETS.items() if known == cfg), None)
    if drift is not None:
        cfg = dataclasses.replace(cfg, drift=float(drift))
    out_dir = Path(out_dir)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    device = resolve_device(cfg.device)
    files = corpus_mod.source_files(cfg.corpus_max_files)
    content_hash = corpus_mod.corpus_hash(files)
    base_key = sha256_json([CODE_VERSION, device.type, content_hash, cfg.base_fields()])[:16]
    tuned_key = sha256_json([base_key, dataclasses.asdict(cfg)])[:16]

    _check_out_dir(out_dir, cache)
    existing = None if force else _cached_pair(out_dir, tuned_key)
    if existing is not None:
        log(f"cached: {out_dir} already holds this pair (key {tuned_key})")
        existing["build_seconds"] = {stage: 0.0 for stage in existing["build_seconds"]}  # none was run
        existing["build_seconds"]["this_call"] = round(time.perf_counter() - begin, 2)
        for side in ("base", "tuned"):
            existing[side]["cached"] = True
        return existing
    # Refused before the work: replacing the current directory whole leaves the shell in a deleted one
    # (and `--out .` was a traceback once both stages had trained).
    if Path.cwd().resolve().is_relative_to(out_dir.resolve()):
        raise LabError("is (or holds) the current directory, which the build replaces whole; "
                       "run it from another directory", out_dir)

    corpus = _Corpus(cfg, files, content_hash)
    base_dir, tuned_dir = cache / f"base-{base_key}", cache / f"tuned-{tuned_key}"
    # Each stage under its cache entry's lock, looked up again once held: studies at other drifts share
    # the base, and one started beside another would train it a second time.
    with torch_threads(cfg.threads):
        with building(base_dir, "base target"):
            base_info = None if force else _cached_stage(base_dir, "base")
            base_cached = base_info is not None
            if not base_cached:
                _build_base(cfg, corpus, base_key, base_dir, device)
                base_info = _read_record(base_dir / "build.json")
        with building(tuned_dir, "tuned target"):
            tuned_info = None if force else _cached_stage(tuned_dir, "tuned", base_info["fingerprint"])
            tuned_cached = tuned_info is not None
            if not tuned_cached:
                _build_tuned(cfg, corpus, base_dir, base_info["fingerprint"], tuned_key, tuned_dir, device)
                tuned_info = _read_record(tuned_dir / "build.json")
    pair = {
        "format": PAIR_FORMAT,
        "key": tuned_key,
        "base_key": base_key,
        "code_version": CODE_VERSION,
        "preset": preset,
        "config": dataclasses.asdict(cfg),
        "drift": cfg.drift,
        "device": device.type,
        "torch_threads": cfg.threads or torch.get_num_threads(),
        "corpus": base_info["corpus"],
        "aux_layer_ids": default_aux_layer_ids(cfg.num_layers),
        "base": {
            "dir": "base",
            "fingerprint": base_info["fingerprint"],
            "params": base_info["params"],
            "train": base_info["train"],
            "cached": base_cached,
        },
        "tuned": {
            "dir": "tuned",
            "fingerprint": tuned_info["fingerprint"],
            "train": tuned_info["train"],
            "cached": tuned_cached,
        },
        "prompts": {
            "train_file": "prompts-train.jsonl",
            "eval_file": "prompts-eval.jsonl",
            **base_info["prompts"],
        },
        "drift_figures": tuned_info["drift_figures"],
        # A cached stage's build.json holds the seconds of another call (its parts summed past this_call).
        # The corpus is this call's parse: a tuned fine-tuned on a cached base parses it too.
        "build_seconds": {**_seconds_spent(base_info, base_cached), **_seconds_spent(tuned_info, tuned_cached),
                          "corpus": corpus.seconds},
    }
    pair["build_seconds"]["this_call"] = round(time.perf_counter() - begin, 2)
    _copy_into(out_dir, base_dir, tuned_dir, pair)
    return pair
