"""Loading any local HF causal-LM directory as a target, and naming it by a fingerprint.

Every command that takes `--target DIR` goes through `load_target`, so Llama, Qwen2, Mistral or
our own tiny pair all load the same way, and a bad directory fails with one line naming it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab.errors import LabError
from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint, weight_files
from drafter_lab.targets.hidden import state_layers

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
LLAMA_EAGLE3_ARCHS = (SGLANG_ARCH, "Eagle3LlamaForCausalLM", "Eagle3DraftModel", "LlamaForCausalLM")
"""Architecture names of plain Llama EAGLE-3 math: SGLang's and SpecForge's, vLLM's and AngelSlim's,
SpecForge's base class (as some checkpoints name it), and the `LlamaForCausalLM` of EAGLE's own
releases (which SGLang serves as EAGLE-3 under that algorithm). drafter.formats reads drafters by them;
they live here, the lower layer, as loading a target refuses a drafter's directory by them too."""

DRAFTER_ARCHS = (*(a for a in LLAMA_EAGLE3_ARCHS if a != "LlamaForCausalLM"), SPECULATORS_ARCH,
                 "LlamaForCausalLMEagle", "EagleLlamaForCausalLM")
"""Architecture names only drafters carry: EAGLE-3's and speculators', and EAGLE(-2)'s in SGLang
and vLLM (`LlamaForCausalLM`, which EAGLE's own releases also use, is a target's name too)."""

# ChatML, used when a target ships no chat template (with a warning).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


REMOTE_CODE_ENV = "DRAFTER_LAB_TRUST_REMOTE_CODE"


def trusts_remote_code() -> bool:
    """Whether a model directory's own Python code (config.json's `auto_map`: Kimi K2's model and
    tokenizer) may run, as with SGLang's and vLLM's --trust-remote-code: `drafter-lab --trust-remote-code`
    sets REMOTE_CODE_ENV, which processes the lab starts (tokenizer workers, torchrun ranks) inherit."""
    return os.environ.get(REMOTE_CODE_ENV, "").lower() in ("1", "true", "yes")


def remote_code_refusal(e: BaseException, path: Path, what: str) -> LabError | None:
    """The one-line refusal for a model whose `what` needs its own code, where that was not allowed
    (transformers' own error asks for an argument the lab's user does not pass; without an explicit
    False it would even stop and prompt on a terminal)."""
    if "trust_remote_code" not in str(e) or trusts_remote_code():
        return None
    return LabError(f"its {what} needs the model's own code (config.json's auto_map): pass --trust-remote-code "
                    f"(drafter-lab --trust-remote-code COMMAND ..., or {REMOTE_CODE_ENV}=1) to run it", path)


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """HF `output_hidden_states` indices [2, L//2, L-3] ("capture before layer i")."""
    return [2, num_layers // 2, num_layers - 3]


def whole_ids(ids, numbering: str, where) -> list[int]:
    """Aux layer ids as ints: each a whole number (2.0 and "2" too, as int() reads them), else one line
    naming `where` and the ids' `numbering`. A hand-written id ("two", null, 2.5, true) was a bare
    ValueError or TypeError, or read as a layer."""
    try:
        listed = list(ids)
        whole = [int(i) for i in listed]
        if isinstance(ids, str) or any(isinstance(i, bool) or not isinstance(i, str) and i != n
                                       for i, n in zip(listed, whole)):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise LabError(f"aux layer ids must be whole numbers ({numbering}), got {ids!r}", where) from None
    return whole


def check_aux_layer_ids(ids, num_layers: int, where) -> list[int]:
    ids = whole_ids(ids, "hidden_states indices", where)
    if len(ids) != 3:
        raise LabError(f"need exactly 3 aux layer ids, got {ids}", where)
    # fc would fuse one layer's features twice; the default (SGLang's too) repeats only on a target of a few
    # layers. Positions are named, as callers shift the ids they were given.
    if len(set(ids)) < 3 and ids != default_aux_layer_ids(num_layers):
        a, b = next((a, b) for a in range(3) for b in range(a + 1, 3) if ids[a] == ids[b])
        raise LabError(f"aux layer ids #{a + 1} and #{b + 1} name the same layer: EAGLE-3 fuses the hidden states "
                       "of three distinct layers", where)
    # SGLang and vLLM append each captured state as their layer loop passes it, so fc reads them in layer
    # order whatever order the config lists: trained on another order, its input blocks would be swapped
    if ids != sorted(ids) and ids != default_aux_layer_ids(num_layers):
        raise LabError(f"aux layer ids {ids} are not in layer order: SGLang and vLLM hand the drafter's fc the states "
                       f"in layer order ({sorted(ids)}), so give them ascending", where)
    # hidden_states[L] is the final norm's output, which no engine captures (SGLang and vLLM take the
    # residual stream before a layer runs): an EAGLE-3 drafter reads 0..L-1
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise LabError(
            f"aux layer id(s) {bad} out of range: hidden_states indices run 0..{num_layers - 1} "
            f"({num_layers} is the final norm's output, which serving engines do not capture)", where
        )
    return ids


LOGITS_SCALING_MULTIPLIES = ("hyperclovax",)
"""Model types whose `logits_scaling` multiplies the logits (HyperCLOVA X's MuP): Granite's divides them."""

LOGIT_SCALE_UNUSED = ("mpt",)
"""Model types whose config carries a `logit_scale` their transformers class never applies (MPT's; real
checkpoints leave it null): Cohere's multiplies the logits by it."""

SOFTCAP_KEYS = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")
"""Config fields that cap the logits: Gemma 2's and most since, RecurrentGemma's, xLSTM's."""


@dataclass(frozen=True)
class LogitMap:
    """How a target turns `final_hidden @ lm_head.T` into its logits: Granite and Inkling divide them
    (`logits_scaling`, which HyperCLOVA X multiplies by; `logits_mup_width_multiplier`), Cohere and
    Falcon-H1 multiply them (`logit_scale`, `lm_head_multiplier`), Gemma 2, RecurrentGemma and xLSTM cap
    them (SOFTCAP_KEYS); a biased head (Phi, GPT-J, CodeGen, CTRL) adds its bias, and Inkling drops the
    logits of its head's padded rows (`unpadded_vocab_size`). Read off the (text) config and the head,
    since training holds the head alone; without it the teacher and the sampled validation would take
    another distribution than the one the target samples from (16x sharper for a Granite of scaling 16)."""

    scale: float = 1.0
    """Multiplies the raw logits."""
    softcap: float | None = None
    """Then logits = softcap * tanh(logits / softcap)."""
    bias: torch.Tensor | None = field(default=None, compare=False)  # by value in __eq__; out of the hash
    """The lm_head's bias, one per row, added to the raw logits first."""
    vocab: int | None = None
    """Inkling's `unpadded_vocab_size`: the logits of the head's rows from it on are dropped."""

    def __eq__(self, other) -> bool:
        # the generated == took two bias tensors' elementwise == as a truth value: a RuntimeError unless one
        # tensor was both sides
        if not isinstance(other, LogitMap):
            return NotImplemented
        if (self.scale, self.softcap, self.vocab) != (other.scale, other.softcap, other.vocab):
            return False
        a, b = self.bias, other.bias
        return a is b or (a is not None and b is not None and a.shape == b.shape
                          and torch.equal(a.detach().cpu().double(), b.detach().cpu().double()))

    @classmethod
    def of(cls, config, bias: torch.Tensor | None = None, where=None) -> LogitMap:
        """The map `config` describes; a scale or cap of NaN or Infinity (Python's json reads them from a
        hand-written config) is refused in one line naming `where`, not turned into NaN logits."""
        scale = 1.0
        model_type = getattr(config, "model_type", None)
        divides = model_type not in LOGITS_SCALING_MULTIPLIES

        def number(key):
            value = getattr(config, key, None)
            if not isinstance(value, int | float) or isinstance(value, bool):
                return None
            if not math.isfinite(value):
                raise LabError(f"{key} is {value}, not a finite number", where)
            return value

        for key, invert in (("logits_scaling", divides), ("logit_scale", False), ("lm_head_multiplier", False),
                            ("output_multiplier", False), ("logits_mup_width_multiplier", True)):
            if key == "logit_scale" and model_type in LOGIT_SCALE_UNUSED:
                continue
            value = number(key)
            if value is not None and value not in (0, 1):
                scale = scale / value if invert else scale * value
        cap = next((c for c in map(number, SOFTCAP_KEYS) if c), None)
        vocab = getattr(config, "unpadded_vocab_size", None)
        vocab = vocab if type(vocab) is int else None  # not a bool, nor a hand-written config's float or string
        return cls(float(scale), None if cap is None else float(cap), bias, vocab)

    def __call__(self, raw: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """`raw` = final_hidden @ lm_head[rows].T, over all the head's rows by default: over some (the draft
        vocabulary's), `rows` picks their bias, and padded ones are masked (-inf) where all would be cut."""
        x = raw
        if self.bias is not None:
            bias = self.bias.to(raw)
            x = x + (bias if rows is None else bias[rows.to(bias.device)])
        x = x * self.scale if self.scale != 1.0 else x
        x = self.softcap * torch.tanh(x / self.softcap) if self.softcap else x
        if self.vocab is None:
            return x
        return x[..., :self.vocab] if rows is None else x.masked_fill(rows.to(x.device) >= self.vocab, -torch.inf)


class _TargetFacts:
    """What the lab reads off a target besides running it: shape, name and its two vocab matrices."""

    path: Path
    fingerprint: str

    @property
    def num_layers(self) -> int:
        return state_layers(self.config)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head_weight().shape[0])

    @property
    def logit_map(self) -> LogitMap:
        return LogitMap.of(self.config, self.lm_head_bias(), self.path / "config.json")

    @functools.cached_property
    def legacy_fingerprint(self) -> str:
        return legacy_fingerprint(self.path)

    def known_as(self, recorded: str | None) -> bool:
        """Whether `recorded`, a fingerprint earlier work wrote down, names this target (either way)."""
        return recorded is not None and (recorded == self.fingerprint or recorded == self.legacy_fingerprint)

    def describe(self) -> dict:
        return {
            "path": str(self.path.absolute()),  # records outlive the cwd a relative --target was given from
            "fingerprint": self.fingerprint,
            "architecture": self.architecture,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
        }


@dataclass
class Target(_TargetFacts):
    """A loaded target model with what the lab needs to know about it."""

    path: Path
    model: torch.nn.Module
    tokenizer: object
    fingerprint: str

    @property
    def config(self):
        """The (text) model config: a multimodal wrapper's own lacks the layer count and hidden size."""
        return self.model.config.get_text_config()

    @property
    def architecture(self) -> str:
        """The wrapper's class where there is one: what a serving engine loads as the verifier. Some
        wrappers (Llama 4's) load as their text model alone, whose config names none: config.json's."""
        archs = self.model.config.architectures or _config_architectures(self.path)
        return (archs or [type(self.model).__name__])[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head_weight(self) -> torch.Tensor:
        return output_embeddings(self.model).weight

    def lm_head_bias(self) -> torch.Tensor | None:
        bias = getattr(output_embeddings(self.model), "bias", None)
        return None if bias is None else bias.detach()


def output_embeddings(model) -> torch.nn.Module | None:
    """The model's lm_head: its own, else its language model's (Nemotron-H Omni's wrapper keeps the head
    there and answers None for itself)."""
    head = model.get_output_embeddings()
    inner = getattr(model, "language_model", None)
    if head is None and isinstance(inner, torch.nn.Module) and callable(getattr(inner, "get_output_embeddings", None)):
        return output_embeddings(inner)
    return head


def _config_architectures(path: Path) -> list | None:
    try:
        archs = atomic.read_json(path / "config.json", "config.json is missing", path).get("architectures")
    except (LabError, AttributeError, TypeError):  # a Target built around a model alone, with no directory
        return None
    return archs if isinstance(archs, list) else None


@dataclass
class TargetHead(_TargetFacts):
    """A target's config, token embedding and lm_head without its layers: all that training and
    evaluating a drafter on captured features need, for the memory of two [V, H] matrices instead of
    the whole model (an 8B target is 32 GB in fp32; its embedding and head are 4 GB)."""

    path: Path
    config: object
    """The (text) model config."""
    embed: torch.Tensor
    lm_head: torch.Tensor
    fingerprint: str
    architecture: str
    """The model class config.json names (a multimodal wrapper's, whose text config names none)."""
    head_bias: torch.Tensor | None = None
    """The lm_head's bias (Phi, GPT-J, CodeGen, CTRL); None where it has none."""

    def embed_weight(self) -> torch.Tensor:
        return self.embed

    def lm_head_weight(self) -> torch.Tensor:
        return self.lm_head

    def lm_head_bias(self) -> torch.Tensor | None:
        return self.head_bias


VOCABULARY_FILES = ("tokenizer.json", "vocab*", "merges.txt", "*.model", "*.tiktoken", "tekken.json")
"""Globs of the files that hold a vocabulary itself (a fast tokenizer's json, BPE and WordPiece
vocabularies, SentencePiece and tiktoken models, Mistral's tekken)."""

TOKENIZER_FILES = ("tokenizer*", *VOCABULARY_FILES[1:])
"""Globs of the files tokenizers read (the vocabulary files, and a tokenizer's configs): a directory
with none holds no tokenizer."""


def check_tokenizer_dir(path: Path) -> None:
    """Refuse a path that is no directory, or one with no tokenizer file (an empty one, a feature or
    drafter directory): else transformers takes it for a hub name, or answers with a paragraph on
    converting slow tokenizers ("install sentencepiece"). Cheap: for a check before long work."""
    _check_dir(path)
    if _holds_any(path, TOKENIZER_FILES):
        return
    missing = "no tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json, ...)"
    if not (path / "config.json").is_file():
        raise LabError(f"not a model or tokenizer directory: no config.json and {missing}", path)
    if (path / "tokenizer").is_dir():  # transformers reads a model's tokenizer from its directory alone
        raise LabError(f"{missing} beside config.json, where transformers reads them (it does not look in the "
                       "tokenizer/ subdirectory): copy them up", path)
    raise LabError(f"{missing}: give the model's own directory, which holds its tokenizer", path)


def _holds_any(path: Path, globs) -> bool:
    """Whether `path` holds a file (or a link, dangling too: loading names it) matching one of `globs`: a
    `tokenizer/` subdirectory matched "tokenizer*", though transformers reads no file in it."""
    return any(not f.is_dir() for g in globs for f in path.glob(g))


def load_tokenizer(path):
    from transformers import AutoTokenizer

    path = Path(path)
    check_tokenizer_dir(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trusts_remote_code())
    except Exception as e:  # transformers raises many types for a broken dir
        if refusal := remote_code_refusal(e, path, "tokenizer"):
            raise refusal from None
        if not _holds_any(path, VOCABULARY_FILES):  # else "install sentencepiece", which won't help
            raise LabError("cannot load tokenizer: no tokenizer.json (nor tokenizer.model, vocab.json or another "
                           "vocabulary file) beside its tokenizer_config.json: a partial download?", path) from None
        raise broken_file(path, TOKENIZER_JSON) or LabError(f"cannot load tokenizer: {first_line(e)}", path) from None
    if not getattr(tok, "chat_template", None):
        warnings.warn(f"{path}: no chat template; using the default ChatML template", stacklevel=2)
        tok.chat_template = DEFAULT_CHAT_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_device(name) -> torch.device:
    """`name` ("auto", "cpu", "cuda", "cuda:N" or a torch.device) as a device this machine has; else a
    one-line error, not torch's assertion from deep inside `model.to`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise LabError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LabError(f"device {name!r}: no CUDA device is visible")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise LabError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def model_class(config):
    """The auto class that builds `config`'s model whole: its causal LM's, else, for a multimodal model
    transformers gives no causal-LM class (Qwen2/2.5/3-VL, Mistral 3, LLaVA), its image-text-to-text
    wrapper, which runs text alone as a causal LM does (input ids in, hidden states and logits out)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if type(config) not in AutoModelForCausalLM._model_mapping and \
            type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM  # whose error names a config it has no class for


def load_target(
    path, device="cpu", dtype: torch.dtype | None = torch.float32, tokenizer: bool = True
) -> Target:
    """Load a local HF causal LM (or text-and-image model) directory, no hub access, for inference."""
    from transformers import AutoConfig

    path, device = Path(path), resolve_device(device)
    _check_model_dir(path)
    check_shards(path)
    if tokenizer:  # before the weights load, which take minutes for a large target
        check_tokenizer_dir(path)
    code = trusts_remote_code()
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=code)
        with quiet_transformers(load_report=False):
            model, info = model_class(config).from_pretrained(
                str(path), dtype=dtype, local_files_only=True, trust_remote_code=code, output_loading_info=True,
                ignore_mismatched_sizes=True)  # refused below by name, not as "see the report above"
    except Exception as e:
        raise (remote_code_refusal(e, path, "model") or broken_file(path, MODEL_JSON, weights=True)
               or LabError(f"cannot load model: {first_line(e)}", path)) from None
    check_loading_info(info, path)
    model.to(device).eval()
    model.requires_grad_(False)
    tok = load_tokenizer(path) if tokenizer else None
    if tok is not None:
        rows = model.get_input_embeddings().num_embeddings
        top = max(tok.vocab_size - 1, max(tok.added_tokens_decoder, default=-1))
        if top >= rows:  # else the first such id fails deep inside the embedding lookup
            raise LabError(f"the tokenizer's ids run to {top}, past the model's {rows}-row embedding "
                           "(tokens added without resizing it?)", path)
    return Target(path=path, model=model, tokenizer=tok, fingerprint=fingerprint(path))


def check_loading_info(info: dict, path: Path) -> None:
    """Refuse what from_pretrained only logs: a weight the files lack or hold at another shape, which it fills
    with random values. A partial download, tensors under other names or a hand-edited config would
    otherwise decode, and capture features, from noise. Unexpected tensors are fine (an MTP layer, say)."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise LabError(f"the weight files lack {missing[0]}{more}, which transformers would fill with random values "
                       "(a partial download, or tensors under other names?)", path)
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        name, stored, wanted = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise LabError(f"tensor {name} has shape {tuple(stored)} in the weight files, config.json gives "
                       f"{tuple(wanted)}{more}", path)


MODEL_JSON = ("config.json", "generation_config.json", "model.safetensors.index.json")
"""The JSON files transformers reads to load a model."""

TOKENIZER_JSON = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.json",
                  "tokenizer.json", "config.json")
"""The JSON files transformers reads to load a tokenizer."""


def broken_file(path: Path, names, weights: bool = False) -> LabError | None:
    """Why transformers failed to load `path`, where one of its files is at fault: a JSON file of `names`
    that is no object (transformers says "'list' object has no attribute 'get'"), or with `weights`, a
    safetensors file truncated or corrupt ("Error while deserializing header", naming none), or where no
    safetensors file is there (transformers then loads the .bin files), a pytorch_model*.bin one (torch's
    "failed finding central directory", naming none). Asked only after a failure: it reads every weight
    file's header, and a .bin's pickled index."""
    for f in (path / name for name in names):
        try:
            data = atomic.read_json(f, "", path) if f.is_file() else {}
        except LabError as e:  # not JSON
            return e
        if not isinstance(data, dict):
            return LabError(f"is a JSON {type(data).__name__}, not the object transformers reads", f)
    files = weight_files(path) if weights else []
    bins = not any(f.suffix == ".safetensors" for f in files)  # else a stray .bin beside them, never read
    for f in files:
        try:
            if f.suffix == ".safetensors":
                with _safetensors(f):
                    pass
            elif bins:
                _torch_weights(f)
        except LabError as e:
            return e
    return None


def _torch_weights(f: Path) -> None:
    """A pytorch_model*.bin read as transformers reads it (weights_only), its tensors on the meta device (no
    data read): a truncated or corrupt one as a one-line error naming it (torch's own error may name nothing,
    or say only "[Errno 22] Invalid argument")."""
    import zipfile

    try:
        with open(f, "rb") as fh:
            zipped = fh.read(4) == b"PK\x03\x04"  # torch's format since 1.6; before, a pickle
        if zipped and not zipfile.is_zipfile(f):  # the directory at a zip's end is missing
            raise LabError("truncated torch weights file: its zip archive has no end (a partial download?)", f)
        torch.load(f, map_location="meta", weights_only=True, mmap=zipped)  # mmap: zip files only
    except OSError as e:
        raise LabError(f"cannot read torch weights file: {e.strerror or first_line(e)}", f) from None
    except LabError:
        raise
    except Exception as e:
        said = first_line(e).split(". ")[0]  # torch's advice after it (weights_only=False...) is not for a corrupt file
        said = said if said == type(e).__name__ else f"{type(e).__name__}: {said}"
        raise LabError(f"cannot read torch weights file (corrupt?): {said}", f) from None


def _check_dir(path: Path) -> None:
    if path.is_file():  # a weights or config file given for its model, say
        raise LabError("is a file, not a model directory: give the directory that holds the model", path)
    if not path.is_dir():
        raise LabError("model directory not found", path)


def check_shards(path: Path) -> None:
    """The shard index transformers will load by, checked (else it says only "'weight_map'"), and every shard
    it names there: a lost one is named before the others load, which takes minutes for a large target."""
    index = path / "model.safetensors.index.json"
    if index.is_file() and not (path / "model.safetensors").exists():
        missing = sorted({f.name for f in _shard_map(index).values() if not f.is_file()})
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            are = "are" if more else "is"
            raise LabError(f"{index.name} names shard {missing[0]}{more}, which {are} missing: a partial download?", path)


def _check_model_dir(path: Path) -> None:
    _check_dir(path)
    config = atomic.read_json(path / "config.json", "not a model directory: config.json is missing", path)
    if not isinstance(config, dict):  # transformers: "Unrecognized model ... Should have a `model_type` key"
        raise LabError(f"is a JSON {type(config).__name__}, not the object transformers reads", path / "config.json")
    archs = config.get("architectures")
    # Else transformers loads its one layer as a whole Llama: a page of missing weights, then a size mismatch.
    # By name, not by "eagle" in it: NVIDIA's Eagle2 models are targets.
    drafter = next((a for a in archs if a in DRAFTER_ARCHS), None) if isinstance(archs, list) else None
    if drafter is not None:
        raise LabError(f"a drafter ({drafter}), not a target model: give the target's own directory", path)
    if not weight_files(path):
        raise LabError("no weight files (*.safetensors or pytorch_model*.bin)", path)


@contextlib.contextmanager
def _safetensors(f: Path):
    """safe_open, with a missing, truncated or corrupt file as a one-line error naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(f), "pt") as fh:
            yield fh
    except (OSError, SafetensorError) as e:
        raise LabError(f"cannot read safetensors file: {first_line(e)}", f) from None


def _shard_map(index: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from a shard index (`model.safetensors.index.json`), checked."""
    data = atomic.read_json(index, "shard index is missing", index.parent)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise LabError("not a shard index (an object whose weight_map names a file per tensor)", index)
    return {name: index.parent / f for name, f in weight_map.items()}


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it: model.safetensors where there is one (as transformers
    loads it, whatever shard index an earlier sharded save left beside it), else the shard index."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        with _safetensors(single) as fh:
            return dict.fromkeys(fh.keys(), single)
    if index.exists():
        return _shard_map(index)
    out = {}
    for f in weight_files(path):
        if f.suffix == ".safetensors":
            with _safetensors(f) as fh:
                out.update(dict.fromkeys(fh.keys(), f))
    return out


def _read_tensor(name: str, files: dict[str, Path]) -> torch.Tensor:
    with _safetensors(files[name]) as fh:
        return fh.get_tensor(name)


def _vocab_names(whole, config, files: dict[str, Path]) -> tuple[list, bool, list, int | None]:
    """The stored names of the embedding, the lm_head and its bias (None: not stored), whether the head is
    the embedding, the three parameters' names (the bias's None where the head has none) and the head's rows
    as the model holds them (None where unknown). Asked of the model class the config names, built on the
    meta device: GPT-2 has `transformer.wte`, Pythia `gpt_neox.embed_in` and an lm_head it stores as
    `embed_out` (transformers renames it on load). Llama's names where it cannot be built, with a bias
    where one is stored."""
    try:
        with torch.device("meta"), quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the flag, as from_pretrained gets it: without it a model class of its own code asks on a terminal
            model = model_class(whole).from_config(whole, trust_remote_code=trusts_remote_code())
        embed, head = model.get_input_embeddings(), output_embeddings(model)
        modules = {m: n for n, m in model.named_modules(remove_duplicate=False)}
        biased = getattr(head, "bias", None) is not None
        params = [f"{modules[embed]}.weight", f"{modules[head]}.weight", f"{modules[head]}.bias" if biased else None]
        tied, rows = head.weight is embed.weight, int(head.weight.shape[0])
    except Exception:  # a config transformers has no class for, or one that builds otherwise
        model, params, rows = None, ["embed_tokens.weight", "lm_head.weight", "lm_head.bias"], None
        tied = bool(getattr(config, "tie_word_embeddings", False))
    loaded_as = _loaded_names(model, files)
    names = [p and _stored_name(p, loaded_as) for p in params]
    if model is None and names[2] is None:
        params[2] = None
    return names, tied, params, rows


def _loaded_names(model, files: dict[str, Path]) -> dict[str, str]:
    """Stored tensor name -> the name transformers loads it as into `model` (its renamings of older
    checkpoints' names; transformers 5 has them, 4.x loads by the stored names)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key

        renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
        return {name: rename_source_key(name, renamings, [])[0] for name in files}
    except Exception:  # no model, or a transformers without these renamings
        return {name: name for name in files}


def _stored_name(param: str, loaded_as: dict[str, str]) -> str | None:
    """The stored tensor that loads as model parameter `param`: the longest tail of its name (module and
    `weight` at least) that a loaded name ends with, as checkpoints drop or add prefixes (GPT-2's is
    saved without `transformer.`, a multimodal wrapper's under its own); of those, the shortest, over the
    copies an MTP layer keeps."""
    parts = param.split(".")
    for k in range(len(parts) - 1):
        tail = ".".join(parts[k:])
        names = sorted((n for n, as_ in loaded_as.items() if as_ == tail or as_.endswith("." + tail)),
                       key=lambda n: len(loaded_as[n]))
        if names:
            return names[0]
    return None


def load_target_config(path) -> tuple:
    """A model directory's config and its text model's (a multimodal wrapper's own lacks the sizes),
    read without loading a weight."""
    from transformers import AutoConfig

    path = Path(path)
    _check_model_dir(path)
    try:
        whole = AutoConfig.from_pretrained(str(path), trust_remote_code=trusts_remote_code())
        return whole, whole.get_text_config()
    except Exception as e:
        if "trust_remote_code" not in str(e):
            raise LabError(f"cannot read the model config: {first_line(e)}", path) from None
        return _config_as_written(path)  # no layer runs: the fields themselves will do


def load_target_head(path, device="cpu") -> TargetHead:
    """A target's config, embedding and lm_head (and the head's bias, where it has one; fp32), read from its
    safetensors files alone.

    The names are the model's own (`_vocab_names`), found under any prefix such as a multimodal
    wrapper's; a tied head is the embedding. A checkpoint without safetensors is loaded whole, once, to
    take the two matrices."""
    path, device = Path(path), resolve_device(device)
    whole, config = load_target_config(path)
    check_shards(path)  # else a lost shard passed unseen where the embedding's and head's were there
    architecture = (getattr(whole, "architectures", None) or [_class_name(whole)])[0]
    files = _tensor_files(path)
    if not files:
        full = load_target(path, device=device, tokenizer=False)
        return TargetHead(path, config, full.embed_weight().detach(), full.lm_head_weight().detach(),
                          full.fingerprint, architecture, full.lm_head_bias())

    (embed_name, head_name, bias_name), tied, (embed_param, head_param, bias_param), rows = \
        _vocab_names(whole, config, files)
    if embed_name is None:
        raise LabError(f"no {embed_param} tensor in the safetensors files", path)
    if head_name is None and not tied:
        raise LabError(f"no {head_param} tensor, and the config does not tie it to the embedding", path)
    if bias_param is not None and bias_name is None:
        raise LabError(f"no {bias_param} tensor in the safetensors files (the model's lm_head has a bias)", path)
    embed = _read_tensor(embed_name, files).float()
    head = embed if head_name is None else _read_tensor(head_name, files).float()
    if embed.shape[1] != int(config.hidden_size) or head.shape[1] != int(config.hidden_size):
        raise LabError(f"embedding {tuple(embed.shape)} / lm_head {tuple(head.shape)} do not match "
                       f"hidden_size {config.hidden_size}", path)
    if rows is not None and rows == getattr(config, "unpadded_vocab_size", None) and rows < len(head):
        head = head[:rows]  # Inkling 2 stores its head padded to vocab_size: transformers drops those rows on load
    bias = None if bias_name is None else _read_tensor(bias_name, files).float()
    if bias is not None and tuple(bias.shape) != (len(head),):
        raise LabError(f"{bias_name} {tuple(bias.shape)} does not match the lm_head's {len(head)} rows", path)
    return TargetHead(path, config, embed.to(device), head.to(device), fingerprint(path), architecture,
                      None if bias is None else bias.to(device))


def _class_name(config) -> str:
    """The class `model_class` builds for a config.json that names none (a hand-written or older tool's):
    what `Target.architecture` says of the same directory, and what a speculators export names as the verifier."""
    from transformers.models.auto import modeling_auto

    names = {**modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, **modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    return names.get(getattr(config, "model_type", None), "unknown")


def text_model_fields(data: dict) -> dict | None:
    """A multimodal config.json's text model fields (`text_config`, or its other names), else None."""
    return next((data[k] for k in ("text_config", "language_config", "llm_config") if isinstance(data.get(k), dict)),
                None)


def _config_as_written(path: Path):
    """config.json's fields as a plain transformers config (whole, and its text model's), for a model
    whose config class is its own code (Kimi K2's): the head needs only sizes and names, no code run."""
    data = atomic.read_json(path / "config.json", "not a model directory: config.json is missing", path)
    whole = _plain_config({k: v for k, v in data.items() if k != "auto_map"})
    text = text_model_fields(data)
    return whole, (whole if text is None else _plain_config(text))


def _plain_config(fields: dict):
    """`fields` on a plain transformers config. A `rope_scaling` is kept as written, in `rope_parameters`
    (which transformers 5's `rope_scaling` reads back): set as such, transformers 5 rewrites and checks it
    against fields a plain config lacks (Kimi K2's yarn: an AttributeError; llama3's without rope_theta)."""
    from transformers import PretrainedConfig

    scaling = fields.get("rope_scaling")
    config = PretrainedConfig(**{k: v for k, v in fields.items() if k != "rope_scaling"})
    if scaling is not None and getattr(config, "rope_parameters", None) is None:
        config.rope_parameters = scaling
    return config


@contextlib.contextmanager
def quiet_transformers(load_report: bool = True):
    """Hide transformers' own progress bars (one per load or save) while loading or saving models:
    the lab shows its own progress, and the bars flood logs without a terminal. `load_report=False`
    hides its LOAD REPORT too, where check_loading_info judges the same keys: the report told of
    missing weights "newly initialized" right above the lab's refusal of them."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    report = logging.getLogger("transformers.modeling_utils")
    drop = _NoLoadReport()
    if not load_report:
        report.addFilter(drop)
    try:
        yield
    finally:
        report.removeFilter(drop)
        if was:
            hf_logging.enable_progress_bar()


class _NoLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def pad_token_id(target) -> int:
    """The id that pads a batch: the tokenizer's where the embedding holds it, else 0. Padding fills
    masked slots only, so any embedded id serves; a <pad> added to the tokenizer without resizing the
    embeddings (or a tokenizer without one) would index past them."""
    pad = getattr(target.tokenizer, "pad_token_id", None)
    return pad if pad is not None and 0 <= pad < target.model.get_input_embeddings().num_embeddings else 0


def stop_token_ids(target) -> list[int]:
    """The ids that end a reply: the tokenizer's eos, the model config's (a multimodal wrapper's own,
    else its text model's) and each one its generation config lists (e.g. <|eot_id|>); the tokenizer's
    first."""
    model = target.model
    config_eos = getattr(model.config, "eos_token_id", None)
    if config_eos is None:
        config_eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    ids: list[int] = []
    for v in (getattr(target.tokenizer, "eos_token_id", None), config_eos,
              getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for i in v if isinstance(v, (list, tuple)) else [v]:
            if type(i) is int and i >= 0 and i not in ids:  # a hand-written `true` or -1 is no token
                ids.append(i)
    return ids


def first_line(e: BaseException) -> str:
    """An exception's message for a one-line error: its first line, or its type where it has none; a
    first line that ends in a colon goes on with the lines it introduces ("from one of: (1) ...")."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    return (" ".join(lines) if lines[0].endswith(":") else lines[0])[:300]
