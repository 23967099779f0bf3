"""Reading and writing drafter checkpoints (config.json + weights) in every supported layout.

Reads: our exports, SGLang/SpecForge/EAGLE (`midlayer.*`), speculators (`layers.0.*`), as
`*.safetensors` (one file or shards) or `pytorch_model.bin` (flat, or nested one level down as training
scripts save it: STATE_DICT_KEYS), with what SGLang and vLLM let a file leave out: the embedding, t2d,
and for a whole-vocabulary drafter d2t and the lm_head (the target's).
Writes: the SGLang layout (what a training run's output directory holds) or the speculators layout,
every file atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.data.vocab import DraftVocab
from drafter_lab.drafter import formats
from drafter_lab.drafter.config import FORMATS, DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter, state_shapes
from drafter_lab.errors import LabError
from drafter_lab.progress import log
from drafter_lab.targets.fingerprint import weight_files
from drafter_lab.targets.hf import first_line

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


@dataclass
class Checkpoint:
    """A drafter checkpoint read from disk, tensors renamed to ours (SGLang's) names."""

    path: Path
    config: DrafterConfig
    format: str
    tensors: dict[str, torch.Tensor]
    files: list[Path]
    where: dict[str, Path] = field(default_factory=dict)
    """File each tensor came from (for error messages)."""
    filled: tuple[str, ...] = ()
    """Vocab tensors the file left out and reading filled in (SGLang and vLLM do the same): d2t as the
    identity, t2d from d2t."""
    config_json: dict = field(default_factory=dict)
    """config.json as read, for what `config` does not keep (a quantization_config, whether draft_vocab_size
    was given): read once, as `config` was, not again in the locale's encoding."""

    def weights_file(self) -> Path:
        return self.files[0] if len(self.files) == 1 else self.path

    @property
    def has_head(self) -> bool:
        """False for a drafter that shares its target's lm_head (SGLang and vLLM load the target's)."""
        return formats.HEAD in self.tensors


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files, else the `.bin` files transformers loads (the target's rule: `pytorch_model*.bin`
    and a shard index's names). An accelerate checkpoint's optimizer.bin, scheduler.bin or sampler.bin beside
    them holds no weight: reading it cost its whole size, and one that weights_only refuses (a pickled
    sampler) or that a killed save cut short refused a whole drafter."""
    files = weight_files(path)
    return [f for f in files if f.suffix == ".safetensors"] or files


STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module")
"""Keys a training script's torch.save nests the state dict under (Lightning's `state_dict`, a plain PyTorch
loop's `model_state_dict` or `model`, DeepSpeed's `module`). SGLang and vLLM read only a flat one."""


def _holds_tensors(state: dict) -> bool:
    return any(isinstance(v, torch.Tensor) for v in state.values())


def _state_dict(state, f: Path) -> dict:
    """The state dict a .bin holds: itself when its top level holds tensors, else the one under the only
    STATE_DICT_KEYS entry that does. Anything else is refused: read as is, a nested one said "lacks
    'fc.weight'" of a file that holds it, and which of two state dicts is the drafter would be a guess."""
    if not isinstance(state, dict):
        raise LabError("weights file does not hold a state dict", f)
    nested = [k for k in STATE_DICT_KEYS if isinstance(state.get(k), dict) and _holds_tensors(state[k])]
    found = (["its top level"] if _holds_tensors(state) else []) + [repr(k) for k in nested]
    if len(found) > 1:
        raise LabError(f"weights file holds tensors under {' and '.join(found)}: which is the drafter is a guess; "
                       "save its state dict alone", f)
    if not found:
        keys = ", ".join(repr(k) for k in list(state)[:5]) + (", ..." if len(state) > 5 else "")
        raise LabError(f"weights file holds no tensors, neither at its top level nor under "
                       f"{', '.join(map(repr, STATE_DICT_KEYS))} (its keys: {keys or 'none'})", f)
    state = state[nested[0]] if nested else state
    unnamed = [k for k, v in state.items() if isinstance(v, torch.Tensor) and not isinstance(k, str)]
    if unnamed:  # weights_only loads an int key too: its tensor has no name to load it by
        raise LabError(f"weights file holds a tensor under the key {unnamed[0]!r}, not under a tensor name", f)
    return state


def _load_error(e: Exception, f: Path) -> LabError:
    """The line for a weights file that does not load: a link to nothing and a pickled object weights_only
    refuses (torch's own line starts with advice in terminal escapes) are not a corrupt file."""
    if f.is_symlink() and not f.exists():  # a cache cleaned, or a download cut short
        return LabError(f"weights file is a link to {os.readlink(f)}, which is missing (a cache cleaned, or a "
                        "download cut short)", f)
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e)) if isinstance(e, pickle.UnpicklingError) \
        else None
    if refused:  # a whole module, or a training script's args saved beside its state dict
        return LabError(f"weights file holds a pickled {refused[1]}, which is not loaded (unpickling it could run "
                        "code): save the drafter's state dict alone (torch.save(model.state_dict()))", f)
    return LabError(f"truncated or corrupt weights file ({first_line(e)})", f)


def _read_file(f: Path, only: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The tensors in one weights file; with `only`, just those (by our names), read alone from a
    safetensors file (a whole .bin is read either way)."""
    try:
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), "pt") as fh:
                return {k: fh.get_tensor(k) for k in fh.keys() if not only or formats.canonical_name(k) in only}
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise many types for a bad file
        raise _load_error(e, f) from None
    return {k: v for k, v in _state_dict(state, f).items()
            if isinstance(v, torch.Tensor) and (not only or formats.canonical_name(k) in only)}


def _read_tensors(files: list[Path], only: tuple[str, ...] = ()) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Tensors of every file under our names, and the file each came from."""
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    named: dict[str, str] = {}  # the name each tensor had in its file
    for f in files:
        for name, t in _read_file(f, only).items():
            canon = formats.canonical_name(name)
            if canon in where:  # e.g. a stale shard beside a re-saved file: which copy is meant is a guess
                raise LabError(f"tensor {canon!r} is in two places, {where[canon].name} ({named[canon]!r}) and "
                               f"{f.name} ({name!r}): remove the stale one", f.parent)
            tensors[canon] = t
            where[canon] = f
            named[canon] = name
    return tensors, where


def _check_dir(path: Path) -> None:
    if path.is_file():
        raise LabError("is a file, not a drafter directory: give the directory that holds it", path)
    if not path.is_dir():
        raise LabError("drafter checkpoint directory not found", path)


def read_config(path) -> tuple[DrafterConfig, str]:
    return _read_config(Path(path))[1:]


def _read_config(path: Path) -> tuple[dict, DrafterConfig, str]:
    """config.json as read, and the config and layout it gives."""
    _check_dir(path)
    cfg_file = path / CONFIG
    data = atomic.read_json(cfg_file, "not a drafter checkpoint: config.json is missing", path)
    return data, *formats.parse_config(data, cfg_file)


SHARD_NAME = re.compile(r"(.+)-(\d+)-of-(\d+)(\.\w+)")
"""A shard's name as save_pretrained writes it (model-00001-of-00002.safetensors): its number, then how many."""


def _check_shards(path: Path, files: list[Path]) -> dict[str, tuple[str, str, str]]:
    """Every shard a shard index names must be there: without one, a tensor it held reads as left out
    (a whole-vocabulary drafter's lm_head as shared with the target), not as lost. Returns where the
    indexes put each tensor: our name -> (index, its name there, shard)."""
    # an index of the other kind names files not read; with no weights file, every shard an index names is lost
    have, kinds = {f.name for f in files}, (files[0].suffix,) if files else (".safetensors", ".bin")
    # shards (model-00001-of-00002.safetensors) need their index; a lone model.safetensors loads without it
    sharded = any(SHARD_NAME.fullmatch(f.name) for f in files)
    placed = {}
    for index in sorted(path.glob("*.index.json")):
        data = atomic.read_json(index, "removed as it was read", path)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if index.name.endswith(f"{kinds[0]}.index.json") and sharded and \
                (not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values())):
            # as transformers does; skipped, a shard lost beside it read as the tensors it held left out
            raise LabError("not a shard index (an object whose weight_map names a file per tensor)", index)
        if not isinstance(weight_map, dict):
            continue
        missing = sorted({v for v in weight_map.values() if isinstance(v, str) and v.endswith(kinds)} - have)
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            are = "are" if more else "is"
            raise LabError(f"{index.name} names shard {missing[0]}{more}, which {are} missing: a save cut short or a "
                           "partial download", path)
        placed.update({formats.canonical_name(k): (index.name, k, v) for k, v in weight_map.items()
                       if isinstance(v, str) and v.endswith(kinds)})
    return placed


def _check_numbered_shards(path: Path, files: list[Path]) -> None:
    """Every shard the `-of-N` names count must be there. Shards without an index are read all, as SGLang and
    vLLM read every *.safetensors (transformers refuses them); one lost read as the tensors it held left out
    (a whole-vocabulary drafter's lm_head as its target's), not as lost."""
    groups: dict[tuple[str, str, str], tuple[int, set[int]]] = {}  # (stem, N, suffix) -> (digits, numbers there)
    for f in files:
        if m := SHARD_NAME.fullmatch(f.name):
            stem, i, n, suffix = m.groups()
            groups.setdefault((stem, n, suffix), (len(i), set()))[1].add(int(i))
    for (stem, n, suffix), (digits, have) in sorted(groups.items()):
        # no save writes one (transformers counts from 1): a file renamed by hand, or another save's
        if past := sorted(i for i in have if not 1 <= i <= int(n)):
            raise LabError(f"shard {stem}-{past[0]:0{digits}d}-of-{n}{suffix} is numbered past the count its name "
                           f"gives ({int(n)}): a shard of another save, or a file renamed by hand", path)
        if lost := int(n) - len(have):
            first = next(i for i in range(1, int(n) + 1) if i not in have)
            more = f" and {lost - 1} more" if lost > 1 else ""
            raise LabError(f"shard {stem}-{first:0{digits}d}-of-{n}{suffix}{more} {'are' if more else 'is'} missing "
                           f"(the shards' names count {int(n)}): a save cut short or a partial download", path)


def _open(path: Path, only: tuple[str, ...] = ()) -> Checkpoint:
    """Config and tensors (all, or `only` those) of a drafter directory, unchecked."""
    data, cfg, fmt = _read_config(path)
    files = _weight_files(path)
    placed = _check_shards(path, files)  # first: all an index's shards lost is not "no weights file"
    if not files:
        raise LabError("no weights file (*.safetensors or pytorch_model.bin)", path)
    tensors, where = _read_tensors(files, only)
    for name, (index, key, shard) in sorted(placed.items()):
        # a shard of another save under the same name: what the index puts there would read as left out, as
        # one missing would
        if name not in tensors and (not only or name in only):
            raise LabError(f"{index} puts tensor {key!r} in {shard}, which does not hold it: a shard of another "
                           "save, or a partial download", path)
    _check_numbered_shards(path, files)  # after reading: a stale file beside a shard is "in two places"
    return Checkpoint(path=path, config=cfg, format=fmt, tensors=tensors, files=files, where=where, config_json=data)


def _check_sizes(ckpt: Checkpoint) -> None:
    """Each tensor the file holds against the shape its config gives, before anything of the config's
    sizes is built: a hand-edited size is a line naming config.json, not an allocation of that size."""
    cfg_file = ckpt.path / CONFIG
    flat = {"d2t": "draft_vocab_size", "t2d": "vocab_size"}  # read flat, whatever their shape
    for name, want in state_shapes(ckpt.config).items():
        t = ckpt.tensors.get(name)
        if t is None:
            continue
        if name in flat and t.numel() != want[0]:
            raise LabError(f"{name} has {t.numel()} entries, the config's {flat[name]} is {want[0]}", cfg_file)
        if name not in flat and tuple(t.shape) != want:
            raise LabError(f"tensor {formats.export_name(name, ckpt.format)!r} has shape {tuple(t.shape)} in "
                           f"{ckpt.where[name].name}, the config's sizes give {want}", cfg_file)


def _fill_vocab(ckpt: Checkpoint) -> None:
    """d2t and t2d checked against each other and the config, and filled in where the file left them out."""
    t = ckpt.tensors
    vocab = DraftVocab.of_drafter_file(t.get("d2t"), t.get("t2d"), ckpt.config.draft_vocab_size,
                                       ckpt.config.target_vocab_size, ckpt.where.get("d2t", ckpt.weights_file()),
                                       ckpt.where.get("t2d"))
    ckpt.filled = tuple(k for k in ("d2t", "t2d") if k not in t)
    t["d2t"], t["t2d"] = vocab.d2t, vocab.t2d


def _under_prefix(tensors: dict, name: str) -> str:
    """Where the file holds `name` under a wrapper's prefix (`module.` of DDP, `_orig_mod.` of torch.compile, a
    training framework's own), said so: else "lacks 'fc.weight'" reads as a drafter without its fc."""
    for key in sorted(tensors):
        for i in (i for i, c in enumerate(key) if c == "."):
            if formats.canonical_name(key[i + 1:]) == name:
                return f" (it holds {key!r}: save the drafter's own state dict, without the {key[:i + 1]!r} prefix)"
    return ""


QUANT_TENSORS = ("weight_scale", "weight_scale_inv", "input_scale", "k_scale", "v_scale", "weight_zero_point",
                 "weight_packed", "weight_shape", "qweight", "qzeros", "scales", "g_idx")
"""Last name parts of what quantizers save beside or for a weight (ModelOpt and FP8-block scales,
compressed-tensors, GPTQ/AWQ)."""


def _refuse_quantized(ckpt: Checkpoint) -> None:
    """A quantized drafter (ModelOpt FP8, compressed-tensors, GPTQ) is one line, not "not part of a
    midlayer" for its scales or a traceback from torch for its FP8 weights: the lab does not apply the
    scales, without which those weights mean nothing."""
    quant = ckpt.config_json.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    for name in sorted(ckpt.tensors):
        t = ckpt.tensors[name]
        if t.is_floating_point() and t.element_size() == 1:
            why = f"is {str(t.dtype).removeprefix('torch.')}"
        elif name.rsplit(".", 1)[-1] in QUANT_TENSORS:
            why = "belongs to a quantized layer"
        else:
            continue
        raise LabError(f"tensor {formats.export_name(name, ckpt.format)!r} {why}: a quantized drafter"
                       f"{f' ({method})' if isinstance(method, str) else ''}, which the lab does not dequantize; "
                       "give its bf16, fp16 or fp32 checkpoint", ckpt.where[name])


def read_checkpoint(path) -> Checkpoint:
    """Read config and tensors of any supported layout; names come back in our layout."""
    path = Path(path)
    _check_dir(path)
    ckpt = _open(path)
    cfg, fmt, tensors, where = ckpt.config, ckpt.format, ckpt.tensors, ckpt.where
    _refuse_quantized(ckpt)  # first: a GPTQ layer's `qweight` would read as a lost `weight`
    fc = tensors.get("fc.weight")
    if "midlayer.hidden_norm.weight" not in tensors and fc is not None and fc.dim() == 2 and \
            cfg.target_hidden_size == cfg.hidden_size and fc.shape[1] == 2 * cfg.hidden_size:
        # EAGLE-1/2 releases name their architecture LlamaForCausalLM too: "lacks input_layernorm" named a symptom
        raise LabError(f"an EAGLE-1/2 drafter (its fc is {tuple(fc.shape)}, over the embedding and one hidden state, "
                       "and it has no hidden_norm), not an EAGLE-3 one", where["fc.weight"])
    for name in formats.REQUIRED_TENSORS:
        if name not in tensors:
            raise LabError(f"checkpoint lacks tensor {formats.export_name(name, fmt)!r}{_under_prefix(tensors, name)}",
                           ckpt.weights_file())
    for name in sorted(tensors):  # what a Llama EAGLE-3 drafter lacks: dropped if it changes nothing, else refused
        part = name.removeprefix("midlayer.")
        if name.endswith(".bias") and not tensors[name].any() or part in formats.MIDLAYER_BUFFERS:
            del tensors[name], where[name]  # so that no reader (load, transfer) meets it
        elif name == "fc.bias":
            raise LabError("fc.bias is non-zero: this drafter's fc has no bias", where[name])
        elif name.startswith("layers.") or (part != name and part not in formats.MIDLAYER_TENSORS):
            # a bias, an extra norm or experts; layers.0 is the midlayer, so layers.1 is a second layer
            raise LabError(f"tensor {formats.export_name(name, fmt)!r} is not part of a Llama EAGLE-3 midlayer",
                           where[name])
        elif part == name and name not in formats.TOP_LEVEL_TENSORS:  # lm_head.bias, norm.bias: load would drop it
            raise LabError(f"tensor {name!r} is not part of a Llama EAGLE-3 drafter", where[name])
    for name in (*formats.REQUIRED_TENSORS, formats.EMBED, formats.HEAD):
        if name in tensors and not tensors[name].is_floating_point():
            raise LabError(f"tensor {formats.export_name(name, fmt)!r} is {tensors[name].dtype}, not a floating-point "
                           "weight", where[name])
        if name in (formats.EMBED, formats.HEAD) and name in tensors and tensors[name].dim() != 2:
            raise LabError(f"tensor {name!r} has shape {tuple(tensors[name].shape)}, not [rows, hidden]", where[name])
    for name, t in tensors.items():  # one NaN weight makes every draft NaN, and training from it stays NaN
        if t.is_floating_point() and name not in formats.VERIFIER_TENSORS and not torch.isfinite(t).all():
            raise LabError(f"tensor {formats.export_name(name, fmt)!r} holds NaN or Inf values", where[name])
    n, v = cfg.draft_vocab_size, cfg.target_vocab_size
    if not ckpt.has_head and n != v:
        raise LabError(f"checkpoint lacks tensor {formats.HEAD!r}, yet its draft vocab ({n}) is smaller than the "
                       f"target's ({v}): only a whole-vocabulary drafter shares its target's head", ckpt.weights_file())
    unsized = ckpt.config_json.get("draft_vocab_size") is None  # read as its vocab_size
    if ckpt.has_head and (rows := len(tensors[formats.HEAD])) != n:
        # a config without the field reads as a whole-vocabulary drafter: "is 128256" named a number it never held
        hint = f" (config.json gives none, which reads as its vocab_size: set draft_vocab_size {rows} there)"
        raise LabError(f"tensor {formats.HEAD!r} has {rows} rows, the config's draft_vocab_size is {n}"
                       f"{hint if unsized else ''}", where[formats.HEAD])
    if fmt == formats.SGLANG and ckpt.has_head and unsized:
        # SGLang's LlamaForCausalLMEagle3 then loads its target's head over the file's (or, reading the field as
        # an attribute, stops when it is absent); vLLM keeps the file's
        log(f"{path / CONFIG}: draft_vocab_size is absent or null, so SGLang would serve this drafter with its "
            "target's lm_head, not the file's (vLLM and the lab use the file's); `export --format sglang` writes it")
    elif fmt == formats.SGLANG and not ckpt.has_head and not unsized:
        # SGLang loads its target's head only for a null field: given one, it keeps the head it allocated, unset
        log(f"{path / CONFIG}: draft_vocab_size is set and the file has no lm_head, so SGLang would serve this "
            "drafter with an uninitialised lm_head, not its target's (vLLM and the lab use the target's); "
            "`export --format sglang` writes it null")
    _check_sizes(ckpt)
    _fill_vocab(ckpt)
    return ckpt


def read_vocab(path) -> DraftVocab:
    """The (d2t, t2d) of a vocab file, or of a drafter directory as `read_checkpoint` fills them in,
    reading those two tensors alone (not a large drafter's embedding and head)."""
    path = Path(path)
    if not path.is_dir():
        return DraftVocab.load(path)
    ckpt = _open(path, ("d2t", "t2d"))
    _check_sizes(ckpt)
    _fill_vocab(ckpt)
    return DraftVocab(d2t=ckpt.tensors["d2t"], t2d=ckpt.tensors["t2d"])


def expected_shapes(cfg: DrafterConfig) -> dict[str, tuple]:
    return state_shapes(cfg)


def check_shape(name: str, tensor: torch.Tensor, want: tuple, where) -> None:
    if tuple(tensor.shape) != tuple(want):
        raise LabError(f"tensor {name!r} has shape {tuple(tensor.shape)}, the drafter needs {tuple(want)}", where)


def _vocab_change(old: int, new: int) -> str:
    return f"the drafter was trained for a {old}-token target, this one has {new}"


def check_vocab_change(cfg: DrafterConfig, vocab_size: int, where) -> None:
    """What `served_with_vocab` refuses from the config alone (before any tensor is read): a drafter
    that embeds with its own matrix."""
    if vocab_size != cfg.target_vocab_size and cfg.own_embedding:
        raise LabError(f"{_vocab_change(cfg.target_vocab_size, vocab_size)}: it embeds with its own "
                       f"{cfg.target_vocab_size}-row matrix, which the new ids run past", where)


def served_with_vocab(ckpt: Checkpoint, vocab_size: int) -> Checkpoint:
    """`ckpt` as an engine serves it beside a target of `vocab_size` tokens where it was trained for
    another size (a version that added tokens): engines map draft ids through d2t alone and embed with
    the target's matrix, so only the recorded size and t2d (rebuilt from d2t) change. Refused, in one
    line, where that cannot run: a draft id past the target's tokens, an embedding of its own (rows of
    the old size), or no lm_head of its own (a whole-vocabulary drafter's head is its target's)."""
    old = ckpt.config.target_vocab_size
    if vocab_size == old:
        return ckpt
    check_vocab_change(ckpt.config, vocab_size, ckpt.path)
    where = _vocab_change(old, vocab_size)
    if not ckpt.has_head:
        raise LabError(f"{where}: it drafts over its target's whole vocabulary with its target's lm_head", ckpt.path)
    ids = ckpt.tensors["d2t"].to(torch.int64) + torch.arange(ckpt.config.draft_vocab_size)
    if int(ids.max()) >= vocab_size:
        raise LabError(f"{where}: its draft tokens name target ids up to {int(ids.max())}", ckpt.path)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return dataclasses.replace(ckpt, config=dataclasses.replace(ckpt.config, target_vocab_size=vocab_size),
                               tensors={**ckpt.tensors, "t2d": t2d})


def load_drafter(path, device="cpu", dtype: torch.dtype = torch.float32, target=None,
                 embed_weight: torch.Tensor | None = None, vocab_size: int | None = None) -> Eagle3Drafter:
    """Build an Eagle3Drafter from a checkpoint directory of any supported layout.

    The token embedding is the serving target's, as in SGLang (which swaps in the target's embedding
    when the widths agree): `embed_weight`, else `target`'s when its hidden size is the drafter's,
    else the checkpoint's own `embed_tokens.weight` (EAGLE/SpecForge releases often omit it). A
    checkpoint without an lm_head takes `target`'s, as SGLang and vLLM serve it. `vocab_size`: serve
    it beside a target of that many tokens (`served_with_vocab`).
    """
    ckpt = read_checkpoint(path)
    if vocab_size is not None:
        ckpt = served_with_vocab(ckpt, vocab_size)
    if embed_weight is None and target is not None and target.hidden_size == ckpt.config.hidden_size:
        embed_weight = target.embed_weight().detach()
    head_weight = None
    if not ckpt.has_head and target is not None:
        head_weight = target.lm_head_weight().detach()
        if head_weight.shape[1] != ckpt.config.hidden_size:
            raise LabError(f"the drafter shares its target's lm_head, but the target's is {head_weight.shape[1]} "
                           f"wide and the drafter's hidden size is {ckpt.config.hidden_size}", ckpt.weights_file())
    return build_drafter(ckpt, device, dtype, embed_weight, head_weight)


def build_drafter(ckpt: Checkpoint, device="cpu", dtype: torch.dtype = torch.float32,
                  embed_weight: torch.Tensor | None = None, head_weight: torch.Tensor | None = None) -> Eagle3Drafter:
    """An Eagle3Drafter holding a read checkpoint's tensors (shapes checked, each named on error).

    `embed_weight`, when given, replaces the checkpoint's embedding; `head_weight` stands for an
    lm_head the checkpoint does not have.
    """
    shapes = expected_shapes(ckpt.config)
    given = {formats.EMBED: embed_weight, formats.HEAD: None if ckpt.has_head else head_weight}
    why = {formats.EMBED: " (its hidden size differs from its target's, so the embedding is its own)"
           if ckpt.config.own_embedding else " (pass the target, whose embedding it uses)",
           formats.HEAD: " (it shares its target's: pass the target)"}
    state = {}
    for name, want in shapes.items():
        t = given.get(name)
        t = ckpt.tensors.get(name) if t is None else t
        if t is None:
            raise LabError(
                f"checkpoint lacks tensor {formats.export_name(name, ckpt.format)!r}{why.get(name, '')}",
                ckpt.weights_file(),
            )
        check_shape(name, t, want, ckpt.where.get(name, ckpt.path))
        state[name] = t
    with torch.device("meta"):
        drafter = Eagle3Drafter(ckpt.config)
    drafter.load_state_dict(state, assign=True)
    drafter.d2t = drafter.d2t.long()
    drafter.t2d = drafter.t2d.bool()
    drafter = drafter.to(device)
    for p in drafter.parameters():
        p.data = p.data.to(dtype)
    return drafter


def drafter_tensors(drafter: Eagle3Drafter, fmt: str = formats.SGLANG, dtype: torch.dtype | None = None,
                    embed: bool = True, head: bool = True) -> dict:
    """The drafter's tensors under the layout's names (float weights cast to dtype if given)."""
    out = {}
    left_out = {n for n, keep in ((formats.EMBED, embed), (formats.HEAD, head)) if not keep}
    for name, t in drafter.state_dict().items():
        if name in left_out:
            continue
        t = t.detach().cpu()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[formats.export_name(name, fmt)] = t.contiguous()
    return out


def save_drafter(drafter: Eagle3Drafter, out_dir, fmt: str = formats.SGLANG, dtype: torch.dtype | None = None,
                 embed: bool = True, head: bool = True, **serving) -> Path:
    """Write config.json + model.safetensors into out_dir (each file atomically; weights first).

    `embed=False` leaves out the (frozen, target-owned) token embedding, as EAGLE releases do;
    `head=False` the lm_head of a drafter that shares its target's. `serving`: what a speculators
    config tells vLLM (formats.speculators_config). `dtype`: every float tensor cast to it; None: each
    keeps its own (and config.json names fc's).
    """
    out_dir = Path(out_dir)
    cfg = formats.config_for(fmt, drafter.config, dtype or drafter.fc.weight.dtype, head, **serving)
    tensors = drafter_tensors(drafter, fmt, dtype, embed, head)
    atomic.save_safetensors(tensors, out_dir / WEIGHTS, metadata=formats.file_metadata(drafter.config, fmt))
    atomic.write_json(out_dir / CONFIG, cfg)
    return out_dir


def export(src, fmt: str, out, dtype: torch.dtype | None = None, speculative_tokens: int | None = None,
           verifier: str | None = None) -> Path:
    """Re-write a drafter in another layout; the output directory appears whole or not at all.

    A speculators export tells vLLM `speculative_tokens` (default: a speculators source's own, else the TTT
    depth the drafter was trained at, from the run.json beside it, else speculators' 5) and the `verifier`
    to serve it with (default: a speculators source's own; a local directory as its absolute path; the
    architecture from run.json)."""
    if fmt not in FORMATS:
        raise LabError(f"unknown drafter format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt != formats.SPECULATORS and (speculative_tokens is not None or verifier is not None):  # SGLang has neither
        raise LabError("--speculative-tokens and --verifier apply to --format speculators")
    if fmt == formats.SPECULATORS:  # before the drafter is read
        if speculative_tokens is not None and speculative_tokens < 1:
            raise LabError(f"speculative_tokens must be at least 1, got {speculative_tokens}")
        if verifier is not None and not verifier.strip():  # vLLM would be told to serve a model named ""
            raise LabError("--verifier is empty: give the target's name or path, or leave it out")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LabError("output is a file: choose a directory", out)
    if out.exists() and any(out.iterdir()):
        raise LabError("output directory exists and is not empty: choose a new one", out)
    ckpt = read_checkpoint(src)
    if fmt == formats.SGLANG and ckpt.config.norm_before_residual:
        raise LabError("norm_before_residual=true: SGLang has no such switch and would serve this drafter with "
                       "plain EAGLE-3's residual; export it in the speculators layout (vLLM) instead", src)
    has_embed = formats.EMBED in ckpt.tensors
    c = ckpt.config
    # A drafter that shares the target's embedding or head has none of its own: zeros fill the module
    # so it builds (one zero, expanded: nothing of that size is allocated), and the export leaves that
    # tensor out as the source did.
    zeros = torch.zeros(()).expand(c.target_vocab_size, c.hidden_size)
    drafter = build_drafter(ckpt, embed_weight=None if has_embed else zeros, head_weight=zeros)
    if dtype is None:  # each tensor as the file holds it: fp32 norms beside bf16 linears stay fp32
        for name, p in drafter.named_parameters():
            if name in ckpt.tensors:
                p.data = ckpt.tensors[name]
    serving = {}
    if fmt == formats.SPECULATORS:
        run = run_record(src)
        # a speculators source's own settings carry over where no flag sets them (re-exporting lost them)
        unset = tuple(k for k, v in (("speculative_tokens", speculative_tokens), ("verifier", verifier)) if v is None)
        own = formats.speculators_serving(ckpt.config_json, Path(src) / CONFIG, unset) \
            if ckpt.format == formats.SPECULATORS else {}
        architecture = recorded_target(src, "architecture", run) if verifier else None
        if architecture is not None and not architecture.strip():
            # carried into vLLM's verifier architectures as is, where a name is looked up ("" was dropped unsaid)
            raise LabError(f"run record's target.architecture is {architecture!r}, not a class name",
                           Path(src) / "run.json")
        serving = {"speculative_tokens": speculative_tokens or own.get("speculative_tokens")
                   or _recorded_depth(run, src) or formats.SPECULATIVE_TOKENS,
                   "verifier": verifier or own.get("verifier"),
                   "verifier_architectures": ((architecture,) if architecture else ()) if verifier
                   else own.get("verifier_architectures", ())}
        if serving["verifier"] is not None and Path(serving["verifier"]).is_dir():
            # `vllm serve DRAFTER` from another directory finds a local verifier only by its absolute path
            serving["verifier"] = os.path.abspath(serving["verifier"])
    with atomic.atomic_dir(out) as tmp:
        save_drafter(drafter, tmp, fmt, dtype, embed=has_embed, head=ckpt.has_head, **serving)
    return out


def run_record(src) -> dict:
    """The training run's record beside a drafter the lab trained ({} for one from elsewhere)."""
    path = Path(src) / "run.json"
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # the latter: `src` is a file
        return {}
    except IsADirectoryError:
        raise LabError("is a directory, not a JSON file", path) from None
    except OSError as e:  # another user's 0600 file, a read error
        raise LabError(f"cannot read it: {e.strerror}", path) from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8 text, or nested too deep for the parser
        raise LabError("not valid JSON", path) from None
    if not isinstance(run, dict) or not isinstance(run.get("config", {}), dict) or \
            not isinstance(run.get("target", {}), dict):
        raise LabError("not a run record (a JSON object with config and target objects)", path)
    return run


def _recorded_depth(run: dict, src) -> int | None:
    """The TTT depth a run record holds, checked: a hand-edited "5" (or NaN) went into vLLM's config as is."""
    depth = run.get("config", {}).get("ttt_steps")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise LabError(f"'ttt_steps' is {depth!r}, not a positive integer", Path(src) / "run.json")
    return depth


def recorded_fingerprint(drafter_dir) -> str | None:
    """The fingerprint of the target a drafter was trained on, from the run record beside it, if any."""
    return recorded_target(drafter_dir, "fingerprint")


def recorded_target(drafter_dir, key: str, record: dict | None = None) -> str | None:
    """Field `key` (fingerprint, path, architecture) of the target the run record beside a drafter names (`record`
    where it was read already), if any: text, else refused (a hand-edited 123 read as "trained on target 123")."""
    recorded = (run_record(drafter_dir) if record is None else record).get("target", {}).get(key)
    if recorded is not None and not isinstance(recorded, str):
        raise LabError(f"run record's target.{key} is {recorded!r}, not a string", Path(drafter_dir) / "run.json")
    return recorded
