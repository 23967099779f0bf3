"""Running an HF target for a few of its hidden states, not all L+1.

`output_hidden_states=True` keeps every layer's output of the batch alive until the forward returns:
33 x [B, S, H] for an 8B Llama, 8.8 GB in bf16 at 8 x 4096 tokens, where EAGLE-3 reads three aux
layers and the last state (1.1 GB). `run_capturing` keeps only the asked indices, read by hooks where
transformers reads them (transformers 5's `capture_outputs`): index 0 is decoder layer 0's input (after
any embedding scaling: Gemma's), index i in 1..L-1 decoder layer i-1's output, index L the decoder's
`last_hidden_state` (the final norm's output). SpecForge and SGLang likewise keep only the layers they
read. A model whose decoder is not laid out so runs with `output_hidden_states=True`: right, only heavier.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import torch

from drafter_lab.errors import LabError


class HiddenStates(Mapping):
    """The kept hidden states by their HF `output_hidden_states` index; negative indices count from
    the end of the full tuple (-1: the final state), as on it."""

    def __init__(self, states: dict[int, torch.Tensor], count: int):
        self._states = states
        self.count = count
        """How many states the full tuple holds: L+1."""

    def __getitem__(self, i: int) -> torch.Tensor:
        j = i + self.count if i < 0 else i
        if j not in self._states:
            raise KeyError(f"hidden state {i} was not kept (kept: {sorted(self._states)} of {self.count})")
        return self._states[j]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._states))

    def __len__(self) -> int:
        return len(self._states)


def _recorder(model_class):
    """transformers 5's record of where a model class's hidden_states come from (None: not recorded)."""
    return (getattr(model_class, "_can_record_outputs", None) or {}).get("hidden_states")


def state_layers(config) -> int:
    """How many layers `output_hidden_states` returns the outputs of (its tuple holds one more): the config
    field transformers' recorder counts them by, where it names one other than num_hidden_layers
    (LongCat-Flash's num_hidden_layers counts two sublayers in each of its num_layers layers)."""
    key = "num_hidden_layers"
    try:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING

        cls = MODEL_MAPPING[type(config)]
        key = getattr(_recorder(cls[0] if isinstance(cls, tuple) else cls), "num_hidden_layers_key", None) or key
    except Exception:  # a config transformers has no class for (remote code), or one without the registry
        pass
    return int(getattr(config, key))


def decoder_layout(model) -> tuple[torch.nn.Module, torch.nn.ModuleList] | None:
    """The text decoder whose hidden states `model` returns, and its decoder layers; None where the
    layout is not the one hooks can read HF's hidden states off (no `layers` list of
    `num_hidden_layers`, or transformers records them elsewhere)."""
    seen, dec = set(), model
    # Down from a causal LM to its base model, from a multimodal wrapper to its language model (Llama 4's
    # is a causal LM in turn, whose get_decoder() is itself: then its `model`)
    while not isinstance(getattr(dec, "layers", None), torch.nn.ModuleList):
        seen.add(id(dec))
        dec = next((m for m in _inner(dec) if isinstance(m, torch.nn.Module) and id(m) not in seen), None)
        if dec is None:
            return None
    layers = dec.layers
    # transformers 5 records hidden_states by a hook on a layer class (`_can_record_outputs`); where that
    # is not every one of these layers, or the last state is not last_hidden_state, its tuple is built
    # otherwise. A model without the registry (remote code) appends before each layer and after the
    # norm, which is the same.
    spec = _recorder(type(dec))
    key = getattr(spec, "num_hidden_layers_key", None) or "num_hidden_layers"
    n = getattr(getattr(dec, "config", None), key, None)
    if not isinstance(n, int) or len(layers) != n or n < 1:
        return None
    if spec is not None:
        cls = getattr(spec, "target_class", spec)
        plain = (getattr(spec, "index", 0) == 0 and getattr(spec, "layer_name", None) is None
                 and getattr(spec, "capture_initial_hidden_state", True))
        if not (isinstance(cls, type) and plain and all(isinstance(layer, cls) for layer in layers)):
            return None
        if getattr(dec.config, "tie_last_hidden_states", None) is False:
            return None
    return dec, layers


def _inner(module):
    get = getattr(module, "get_decoder", None)
    if callable(get):
        try:
            yield get()
        except (AttributeError, NotImplementedError, ValueError):  # a model class with no rule for it
            pass
    yield getattr(module, "model", None)
    yield getattr(module, "language_model", None)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


_HOOKED = threading.Lock()
"""Held from a capture's first hook to its last: hooks on shared layers fire for every forward through
them, so two captures at once (an online run's prefetch thread beside its validation) each saw both
forwards' states, and registering a hook while another thread's forward walks the hooks may fail."""


def run_capturing(model, indices, *, final: bool = True, **forward_kwargs) -> tuple[object, HiddenStates]:
    """`model(**forward_kwargs)` -> (its output without hidden states, HiddenStates): the states at
    `indices` (HF `output_hidden_states` indices) and, with `final`, the last one, each exactly the
    tensor `output_hidden_states=True` would have put there. Captures from several threads run one at
    a time."""
    layout = decoder_layout(model)
    if layout is None:
        return _run_whole(model, indices, final, forward_kwargs)
    with _HOOKED:
        return _run_hooked(model, layout, indices, final, forward_kwargs)


def _run_hooked(model, layout, indices, final: bool, forward_kwargs: dict) -> tuple[object, HiddenStates]:
    dec, layers = layout
    count = len(layers) + 1
    got: dict[int, list[torch.Tensor]] = {i: [] for i in _wanted(indices, final, count)}

    def keep(i, x):
        if not isinstance(x, torch.Tensor):
            raise LabError(f"hidden state {i}: the model's decoder passed a {type(x).__name__}, not a tensor")
        got[i].append(x)

    hooks = []
    try:
        for i in sorted(got):
            if i == 0:
                hooks.append(layers[0].register_forward_pre_hook(
                    lambda m, args, kwargs: keep(0, args[0] if args else kwargs.get("hidden_states")),
                    with_kwargs=True))
            elif i < count - 1:
                hooks.append(layers[i - 1].register_forward_hook(lambda m, a, out, i=i: keep(i, _first(out))))
            else:
                hooks.append(dec.register_forward_hook(
                    lambda m, a, out: keep(count - 1, getattr(out, "last_hidden_state", None)
                                          if not isinstance(out, tuple) else out[0])))
        out = model(**forward_kwargs, output_hidden_states=False)
    finally:
        for h in hooks:
            h.remove()
    # Each hook fires once per forward on this layout; else the states would be a guess.
    odd = sorted(i for i, xs in got.items() if len(xs) != 1)
    if odd:
        raise LabError(f"hidden state {odd[0]} was seen {len(got[odd[0]])} times in one forward of "
                       f"{type(model).__name__}: its decoder does not run its layers once each in order")
    return out, _checked(model, {i: xs[0] for i, xs in got.items()}, count)


def _checked(model, states: dict[int, torch.Tensor], count: int) -> HiddenStates:
    """EAGLE-3 reads one [batch, tokens, hidden] state per layer; Gemma 3n's decoder carries its AltUp
    streams stacked in front ([streams, batch, tokens, hidden]), which would be read as the batch."""
    odd = next((i for i in sorted(states) if states[i].dim() != 3), None)
    if odd is not None:
        raise LabError(f"hidden state {odd} of {type(model).__name__} is {tuple(states[odd].shape)}, not "
                       "[batch, tokens, hidden], the one state per layer an EAGLE-3 drafter reads (Gemma 3n's decoder "
                       "stacks its AltUp streams in front)")
    return HiddenStates(states, count)


def _wanted(indices, final: bool, count: int) -> set[int]:
    """`indices` (and with `final` the last) as indices 0..count-1 into the full tuple."""
    want = set()
    for i in [*indices, *([-1] if final else [])]:
        if not -count <= int(i) < count:
            raise LabError(f"hidden state index {i} out of range: the model has {count} (0..{count - 1})")
        want.add(int(i) % count)
    return want


def _run_whole(model, indices, final: bool, forward_kwargs: dict) -> tuple[object, HiddenStates]:
    out = model(**forward_kwargs, output_hidden_states=True)
    hs = getattr(out, "hidden_states", None)
    if not hs:  # remote code that ignores the flag: else len(None)'s TypeError
        raise LabError(f"{type(model).__name__} returned no hidden states for output_hidden_states=True (remote "
                       "code that ignores the flag?), and has no decoder layers the lab can hook instead")
    states = {i: hs[i] for i in _wanted(indices, final, len(hs))}
    out["hidden_states"] = None  # the whole tuple goes as soon as the caller has its states
    return out, _checked(model, states, len(hs))
