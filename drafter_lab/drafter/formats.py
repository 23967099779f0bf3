"""Drafter checkpoint layouts: tensor names and config.json fields of SGLang and speculators.

Our module names are SGLang's (`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`, `embed_tokens`),
so the SGLang layout is the identity. The speculators layout calls the midlayer `layers.0`.

Aux layer ids (DESIGN "Aux layers"). In memory we keep indices into HF `output_hidden_states`
(convention `hf_hidden_states`). The files differ:
- SGLang's `LlamaForCausalLMEagle3` config (`eagle_config.eagle_aux_hidden_state_layer_ids`) is read
  by SGLang as "output of layer k": its target captures before layer k+1 (sglang 0.5.23,
  `set_eagle3_layers_to_capture`: `layers_to_capture = [val + 1 for val in layer_ids]`). SpecForge
  and ModelOpt write that form too, so the SGLang layout stores ours - 1, and ours unchanged at the
  top level, where vLLM looks when it serves this layout.
- speculators (vLLM) configs store `eagle_aux_hidden_state_layer_ids` as "capture before layer i",
  which is ours unchanged.
The conversion happens only here, at import and export, and each file says which form it holds.
"""

from __future__ import annotations

import json
import math

import torch

from drafter_lab.drafter.config import FORMATS, SGLANG, SPECULATORS, DrafterConfig
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import LLAMA_EAGLE3_ARCHS, SGLANG_ARCH, SPECULATORS_ARCH, text_model_fields

SGLANG_AUX_CONVENTION = "output_of_layer"  # hidden_states index = id + 1

MIDLAYER_TENSORS = (
    "input_layernorm.weight",
    "hidden_norm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
MIDLAYER_BUFFERS = ("self_attn.rotary_emb.inv_freq",)
"""Midlayer tensors a file may carry beside the weights (older transformers saved RoPE's buffer); dropped."""
# Every file holds these. SGLang and vLLM also load a drafter without `lm_head.weight` (it shares its
# target's head), without `d2t` (its draft ids are target ids) and without `t2d` (which they never read).
REQUIRED_TENSORS = ("fc.weight", *(f"midlayer.{n}" for n in MIDLAYER_TENSORS), "norm.weight")
EMBED = "embed_tokens.weight"
HEAD = "lm_head.weight"
VERIFIER_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")
"""The target's head and norm some training frameworks save beside the drafter: carried, never loaded."""
TOP_LEVEL_TENSORS = ("fc.weight", "norm.weight", EMBED, HEAD, "d2t", "t2d", *VERIFIER_TENSORS)

_MIDLAYER_PREFIXES = ("midlayer.", "layers.0.")


def canonical_name(name: str) -> str:
    """Map a tensor name from any supported layout to ours (SGLang's); a leading "model." is dropped."""
    name = name.removeprefix("model.")
    for prefix in _MIDLAYER_PREFIXES:
        if name.startswith(prefix):
            return "midlayer." + name[len(prefix):]
    return name


def export_name(name: str, fmt: str) -> str:
    if fmt == SPECULATORS and name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    return name


def detect_format(data: dict) -> str:
    archs = data.get("architectures")  # checked by _refuse_other_families; a number is not searched
    if data.get("speculators_model_type") is not None or isinstance(archs, list) and SPECULATORS_ARCH in archs:
        return SPECULATORS
    return SGLANG


def _llama_fields(cfg: DrafterConfig, dtype: torch.dtype) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.target_vocab_size,
        "num_hidden_layers": 1,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def sglang_config(cfg: DrafterConfig, dtype: torch.dtype, head: bool = True) -> dict:
    """config.json that SGLang's LlamaForCausalLMEagle3 reads (see tests/drafter/test_sglang_compat.py).

    `head=False`: the file has no lm_head (the drafter shares its target's). SGLang loads the target's
    head only when draft_vocab_size is null (given one, it would keep an uninitialised head), and reads
    the field as an attribute: a config without it stops SGLang with an AttributeError.
    """
    out = {"architectures": [SGLANG_ARCH], **_llama_fields(cfg, dtype)}
    out["draft_vocab_size"] = cfg.draft_vocab_size if head else None
    if cfg.norm_before_residual:  # read by vLLM and by the lab; `export --format sglang` refuses it
        out["norm_before_residual"] = True
    if cfg.target_hidden_size != cfg.hidden_size:
        out["target_hidden_size"] = cfg.target_hidden_size
    if cfg.aux_layer_ids:
        out["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids],
            "aux_layer_ids_convention": SGLANG_AUX_CONVENTION,
        }
        # vLLM serves this layout too but reads only the top-level ids, in its own numbering (ours); without
        # them it captures its default layers. SGLang ignores the field.
        out["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    return out


MAX_VOCAB = 2**31 - 1
"""Largest vocabulary a config.json may name (token ids are int32 in vLLM and 32-bit in HF tokenizers)."""

SPECULATIVE_TOKENS = 5
"""speculators' default draft length per step (its greedy proposal's), and the lab's TTT depth."""


def speculators_config(cfg: DrafterConfig, dtype: torch.dtype, speculative_tokens: int = SPECULATIVE_TOKENS,
                       verifier: str | None = None, verifier_architectures: tuple[str, ...] = ()) -> dict:
    """config.json in speculators' Eagle3 layout (transformer_layer_config + speculators_config).

    vLLM reads `speculative_tokens` as num_speculative_tokens where --speculative-config does not set it,
    and `vllm serve DRAFTER` serves the verifier (the target's name or path) with the drafter."""
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": _llama_fields(cfg, dtype),
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "target_hidden_size": cfg.target_hidden_size if cfg.target_hidden_size != cfg.hidden_size else None,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids) or None,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens, "accept_tolerance": 0.0,
                 "verifier_accept_k": 1}
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def speculators_serving(data: dict, path, keys: tuple[str, ...] = ("speculative_tokens", "verifier")) -> dict:
    """What a speculators config.json tells vLLM besides the drafter, as speculators_config's keywords (only
    those the file sets): vLLM's draft length (the first proposal's, as vLLM reads it) and the verifier with
    its architectures. `keys`: which to read (and check); a flag that sets the other leaves it unread."""
    sc = _object(data, "speculators_config", path)
    out = {}
    if "speculative_tokens" in keys:
        methods = _given(sc, "proposal_methods", [])
        if not isinstance(methods, list) or not all(isinstance(m, dict) for m in methods):
            raise LabError(f"config's 'proposal_methods' is {methods!r}, not a list of JSON objects", path)
        if methods and methods[0].get("speculative_tokens") is not None:
            out["speculative_tokens"] = _positive(methods[0], "speculative_tokens", path)
    if "verifier" in keys:
        verifier = _object(sc, "verifier", path)
        name, archs = verifier.get("name_or_path"), _given(verifier, "architectures", [])
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise LabError(f"config's verifier 'name_or_path' is {name!r}, not a model name or path", path)
        if not isinstance(archs, list) or not all(isinstance(a, str) and a.strip() for a in archs):
            raise LabError(f"config's verifier 'architectures' is {archs!r}, not a list of class names", path)
        if name is not None:
            out["verifier"] = name
        if archs:
            out["verifier_architectures"] = tuple(archs)
    return out


def config_for(fmt: str, cfg: DrafterConfig, dtype: torch.dtype, head: bool = True, **serving) -> dict:
    """`serving`: speculators_config's keywords, for that layout."""
    if fmt == SGLANG:
        return sglang_config(cfg, dtype, head)
    if fmt == SPECULATORS:
        return speculators_config(cfg, dtype, **serving)
    raise LabError(f"unknown drafter format {fmt!r}; known: {', '.join(FORMATS)}")


def _positive(data: dict, key: str, path, default=None, kind: type = int):
    """Field `key`, a positive int (or with `kind=float`, any finite positive number: JSON's Infinity as
    an eps zeroes every norm); `default` when it is absent or null, required without one."""
    value = data.get(key)
    if value is None:
        if default is None:
            raise LabError(f"config lacks {key!r}", path)
        return default
    number = value if kind is int and isinstance(value, int) and not isinstance(value, bool) else _number(value)
    if number is None or not number > 0 or kind is int and not isinstance(value, int):
        raise LabError(f"config's {key!r} is {value!r}, not a positive {'integer' if kind is int else 'number'}", path)
    return number


def _number(value) -> float | None:
    """A JSON number as a finite float; None for anything else (true, a string, NaN, Infinity, or an integer
    past float's range, which JSON allows and float() refuses with an OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _ids(data: dict, key: str, path) -> list[int]:
    """Field `key`, a list of layer ids ([] when absent or null)."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise LabError(f"config's {key!r} is {value!r}, not a list of integers", path)
    return value


def _object(data: dict, key: str, path) -> dict:
    """Field `key`, a JSON object ({} when absent or null)."""
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise LabError(f"config's {key!r} is {value!r}, not a JSON object", path)
    return value or {}


def _given(data: dict, key: str, default):
    """Field `key` as written, `default` when absent or null (HF configs write null for a field left unset)."""
    value = data.get(key)
    return default if value is None else value


def _flag(data: dict, key: str, path, default: bool = False) -> bool:
    """Field `key`, a JSON boolean (`default` when absent or null); a string such as "false" would be
    truthy, so anything else is refused rather than read as true."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise LabError(f"config's {key!r} is {value!r}, not true or false", path)
    return value


def _refuse_other_families(data: dict, layer: dict, path) -> None:
    """Drafters of another family (SpecForge's GPT-OSS, Qwen-MoE or DFlash drafters, speculators' EAGLE-1,
    a Qwen3 layer with its q/k norms) share the config fields but not the math: refused, not read as
    a Llama EAGLE-3 midlayer. A layer's model_type picks its class in speculators' config (vLLM builds
    it); beside an SGLang architecture it is only what the trainer copied from the target's config
    (SpecForge's Kimi-K2 drafter says "kimi_k2"): SGLang and vLLM build the architecture's Llama layer,
    and read_checkpoint refuses a tensor that layer lacks."""
    kind = data.get("speculators_model_type")
    if kind is not None and kind != "eagle3":
        raise LabError(f"speculators model type {kind!r} is not supported (eagle3 only)", path)
    given = data.get("architectures") or []
    if not isinstance(given, list) or not all(isinstance(a, str) for a in given):  # a string was read letter by letter
        raise LabError(f"config's 'architectures' is {given!r}, not a list of class names", path)
    archs = [a for a in given if a not in (*LLAMA_EAGLE3_ARCHS, SPECULATORS_ARCH)]
    if archs:
        raise LabError(f"drafter architecture {archs[0]!r} is not supported (Llama EAGLE-3 only: "
                       f"{', '.join(LLAMA_EAGLE3_ARCHS)} or {SPECULATORS_ARCH})", path)
    model_type = _given(layer, "model_type", "llama")
    if layer is not data and model_type != "llama":
        raise LabError(f"drafter layer model_type {model_type!r} is not supported (Llama EAGLE-3 only)", path)


_DRAFTER_NAME_PARTS = ("eagle", "draft", "speculator", "mtp")
"""What a drafter's architecture name says (EAGLE-3, DFlash, speculators, MTP): one without is a model's."""


def _refuse_target(data: dict, path) -> None:
    """A target model's directory given as the drafter (the mirror of targets.hf's check): its layers
    would read as a drafter "of 8 layers". A model's architecture name (`LlamaForCausalLM`, which EAGLE's
    one-layer releases use too) with more than one layer, its own or its text model's."""
    archs = data.get("architectures")
    if data.get("speculators_model_type") is not None or not isinstance(archs, list) or not archs or \
            any(not isinstance(a, str) or any(p in a.lower() for p in _DRAFTER_NAME_PARTS) for a in archs):
        return
    text = text_model_fields(data) or {}
    layers = _given(data, "num_hidden_layers", text.get("num_hidden_layers"))
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 1:
        raise LabError(f"a target model ({archs[0]}, {layers} layers), not a drafter: give the drafter's directory",
                       path)


def _refuse_variants(data: dict, path) -> None:
    """Drafter variants whose math the reference model does not implement are refused, not misread."""
    eagle = _object(data, "eagle_config", path)
    for key in ("norm_before_fc", "fc_norm", "use_aux_norm", "norm_output", "additional_fc", "attention_bias",
                "mlp_bias"):
        if _flag(data, key, path) or _flag(eagle, key, path):
            raise LabError(f"drafter variant {key}=true is not supported (plain EAGLE-3 only)", path)
    act = _given(data, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise LabError(f"drafter hidden_act {act!r} is not supported (SiLU only)", path)
    if not _flag(eagle, "use_aux_hidden_state", path, True):  # vLLM: no fc, the target's last state goes in as is
        raise LabError("drafter with use_aux_hidden_state=false is not supported (EAGLE-3's fc over aux states only)",
                       path)
    scale = _given(data, "logit_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float):  # "1.0" would read as an unsupported 1.0
        raise LabError(f"config's 'logit_scale' is {scale!r}, not a number", path)
    if scale != 1.0:  # vLLM scales the draft logits by it
        raise LabError(f"drafter logit_scale {scale} is not supported (1.0 only)", path)
    layers = _given(data, "num_hidden_layers", 1)
    if isinstance(layers, bool) or not isinstance(layers, int):  # "1" would read as a drafter of "1 layers"
        raise LabError(f"config's 'num_hidden_layers' is {layers!r}, not an integer", path)
    if layers != 1:
        raise LabError(f"drafter has {layers} layers; EAGLE-3 here has exactly one midlayer", path)


ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""The RoPE scalings the reference implements, with the keys each needs."""


def rope_scaling_of(layer: dict, where) -> dict | None:
    """The RoPE scaling a config.json's layer fields ask for (`rope_scaling`, or transformers 5's
    `rope_parameters`), checked; None for plain RoPE. A kind the reference does not implement (yarn,
    dynamic, longrope, mrope) is one line, not plain RoPE in disguise."""
    key = "rope_scaling" if layer.get("rope_scaling") not in (None, {}) else "rope_parameters"
    params = _given(layer, key, {})
    if not isinstance(params, dict):
        raise LabError(f"{key} is not a JSON object: {params!r}", where)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if not isinstance(kind, str) or kind not in ROPE_SCALING_KEYS:
        raise LabError(f"RoPE scaling {kind!r} is not supported (plain, {' or '.join(ROPE_SCALING_KEYS)} only)", where)
    missing = [k for k in ROPE_SCALING_KEYS[kind] if k not in params]
    if missing:
        raise LabError(f"{kind} RoPE scaling lacks {', '.join(missing)}", where)
    # true read as 1.0; an infinite factor turns RoPE off
    odd = [k for k in ROPE_SCALING_KEYS[kind] if _number(params[k]) is None]
    if odd:
        raise LabError(f"{kind} RoPE scaling's {', '.join(f'{k} {params[k]!r}' for k in odd)} is not a finite number",
                       where)
    out = {"rope_type": kind, **{k: _number(params[k]) for k in ROPE_SCALING_KEYS[kind]}}
    if not out["factor"] > 0:  # the slow frequencies are divided by it: 0 gives NaN logits
        raise LabError(f"{kind} RoPE scaling needs factor > 0, got {params['factor']!r}", where)
    if kind == "llama3":
        original = params["original_max_position_embeddings"]
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise LabError(f"llama3 RoPE scaling's original_max_position_embeddings is {original!r}, not a positive "
                           "integer", where)
        out["original_max_position_embeddings"] = original
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise LabError("llama3 RoPE scaling needs high_freq_factor > low_freq_factor", where)
    return out


def rope_scaling_from_text(text: str, where) -> dict | None:
    """A `--drafter-rope-scaling` value ("" = plain RoPE, else config.json's `rope_scaling` as JSON), checked."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:  # also an integer of over 4300 digits, or nesting too deep
        raise LabError(f"rope scaling is not JSON: {text!r} ({e})", where) from None
    return rope_scaling_of({"rope_scaling": value}, where)


def rope_scaling_text(scaling: dict | None) -> str:
    """The inverse of rope_scaling_from_text."""
    return json.dumps(scaling, sort_keys=True) if scaling else ""


def parse_config(data: dict, path) -> tuple[DrafterConfig, str]:
    """DrafterConfig from a config.json of any supported layout; returns (config, format). Every field
    is checked as it is read: a malformed one is a line naming the file, not a traceback."""
    if not isinstance(data, dict):
        raise LabError(f"config is {type(data).__name__}, not a JSON object", path)
    fmt = detect_format(data)
    layer = _object(data, "transformer_layer_config", path) if fmt == SPECULATORS else data
    _refuse_target(data, path)
    _refuse_other_families(data, layer, path)
    _refuse_variants(data, path)
    if fmt == SPECULATORS:
        _refuse_variants(layer, path)
        aux = _ids(data, "eagle_aux_hidden_state_layer_ids", path)  # already hf_hidden_states
        # as vLLM reads it (update_eagle3): the speculators default when the file does not say; an explicit
        # null reaches vLLM's model as None, the plain residual
        norm_before_residual = _flag(data, "norm_before_residual", path, "norm_before_residual" not in data)
    else:
        if _flag(data, "tie_word_embeddings", path):  # vLLM's EAGLE-3 model keeps its own head whatever the flag says
            raise LabError("config sets tie_word_embeddings=true: SGLang would take the embedding as the head and "
                           "drop lm_head.weight (set it false if lm_head.weight is the head)", path)
        aux = [i + 1 for i in _ids(_object(data, "eagle_config", path), "eagle_aux_hidden_state_layer_ids", path)]
        # vLLM's own configs put them at the top level, in its convention (hf_hidden_states), and vLLM reads
        # only those
        top = _ids(data, "eagle_aux_hidden_state_layer_ids", path)
        if aux and top and aux != top:
            raise LabError(f"config's aux layer ids disagree: eagle_config's {[i - 1 for i in aux]} (output of layer "
                           f"i, hidden_states {aux}) and the top-level {top} (hidden_states)", path)
        aux = aux or top
        norm_before_residual = _flag(data, "norm_before_residual", path)
    if aux and len(aux) != 3:  # else export passed it, and only eval (check_aux_layer_ids) refused it
        raise LabError(f"config's eagle_aux_hidden_state_layer_ids has {len(aux)} ids: an EAGLE-3 drafter's fc fuses "
                       "the hidden states of exactly 3 layers (fc.weight is [hidden, 3 x target_hidden_size])", path)
    hidden = _positive(layer, "hidden_size", path)
    heads = _positive(layer, "num_attention_heads", path)
    if hidden < heads and layer.get("head_dim") is None:  # hidden // heads would be a head_dim of 0
        raise LabError(f"config's hidden_size {hidden} is smaller than its num_attention_heads {heads}, so head_dim "
                       "cannot default to hidden_size // num_attention_heads: give head_dim", path)
    scaling = rope_scaling_of(layer, path)
    rope = _positive(_object(layer, "rope_parameters", path), "rope_theta", path, 10000.0, float)
    target_vocab = _positive(layer, "vocab_size", path)
    draft_vocab = _positive(data, "draft_vocab_size", path, target_vocab)
    for key, size in (("vocab_size", target_vocab), ("draft_vocab_size", draft_vocab)):
        # a file may hold nothing of the vocabulary's size (a whole-vocabulary drafter that shares its target's
        # embedding and head): reading it would allocate its d2t and t2d
        if size > MAX_VOCAB:
            raise LabError(f"config's {key!r} is {size}, past the 32-bit token ids of tokenizers and engines", path)
    if draft_vocab > target_vocab:  # each draft id names a distinct target token (d2t)
        raise LabError(f"config's draft_vocab_size {draft_vocab} is larger than its vocab_size {target_vocab}: a draft "
                       "vocabulary is a subset of the target's", path)
    cfg = DrafterConfig(
        hidden_size=hidden,
        intermediate_size=_positive(layer, "intermediate_size", path),
        num_attention_heads=heads,
        num_key_value_heads=_positive(layer, "num_key_value_heads", path, heads),
        head_dim=_positive(layer, "head_dim", path, hidden // heads),
        draft_vocab_size=draft_vocab,
        target_vocab_size=target_vocab,
        target_hidden_size=_positive(data, "target_hidden_size", path, hidden),
        aux_layer_ids=aux,
        rope_theta=_positive(layer, "rope_theta", path, rope, float),
        rope_scaling=scaling,
        rms_norm_eps=_positive(layer, "rms_norm_eps", path, 1e-6, float),
        max_position_embeddings=_positive(layer, "max_position_embeddings", path, 4096),
        norm_before_residual=norm_before_residual,
    )
    if problem := cfg.attention_problem():
        raise LabError(f"config's {problem}", path)
    return cfg, fmt


def file_metadata(cfg: DrafterConfig, fmt: str) -> dict:
    """safetensors metadata: which layout, and the aux ids in our own convention."""
    return {
        "format": "pt",
        "drafter_lab_layout": fmt,
        "aux_layer_ids_hf_hidden_states": json.dumps(list(cfg.aux_layer_ids)),
    }
