"""Review s76 (h9) of targets/hidden.py, on small hand-built decoders: which layouts the hooks may read
(the recorder transformers names, the layer count, tie_last_hidden_states), decoders reached through
get_decoder / language_model, layers given their input by keyword, and the layer count of a config
transformers has no class for."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from drafter_lab.errors import LabError
from drafter_lab.targets import hidden
from drafter_lab.targets.hidden import decoder_layout, run_capturing, state_layers


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, hidden_states):
        return (torch.tanh(self.proj(hidden_states)),)


class _Other(nn.Module):
    pass


class _Decoder(nn.Module):
    """HF's layout: `layers` of num_hidden_layers, hidden_states[0] the first layer's input, the last the
    norm's output. `by_keyword` hands each layer its input as `hidden_states=`."""

    def __init__(self, n=3, by_keyword=False, **config):
        super().__init__()
        self.layers = nn.ModuleList(_Layer() for _ in range(n))
        self.norm = nn.LayerNorm(4)
        self.config = types.SimpleNamespace(num_hidden_layers=n, **config)
        self.by_keyword = by_keyword

    def forward(self, x, output_hidden_states=False):
        states = [x]
        for layer in self.layers:
            x = (layer(hidden_states=x) if self.by_keyword else layer(x))[0]
            states.append(x)
        x = self.norm(x)
        states[-1] = x
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(states) if output_hidden_states else None)


class _Model(nn.Module):
    """A causal LM around `decoder` as `attr`; records the output_hidden_states it was called with."""

    def __init__(self, decoder, attr="model", get_decoder=None):
        super().__init__()
        setattr(self, attr, decoder)
        self.decoder = decoder
        self.asked = []
        if get_decoder is not None:
            self.get_decoder = get_decoder

    def forward(self, x, output_hidden_states=False):
        self.asked.append(output_hidden_states)
        return self.decoder(x, output_hidden_states=output_hidden_states)


def _recording(cls, spec):
    """A subclass of `cls` whose transformers recorder for hidden_states is `spec`."""
    return type(cls.__name__ + "Recorded", (cls,), {"_can_record_outputs": {"hidden_states": spec}})


def _x():
    return torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))


def _check_hooked(model, indices=(0, 1, 2, -1)):
    """run_capturing read `model` by hooks and got each state output_hidden_states=True gives."""
    with torch.no_grad():
        want = model(_x(), output_hidden_states=True).hidden_states
        model.asked.clear()
        _, hs = run_capturing(model, list(indices), x=_x())
    assert model.asked == [False]
    assert len(hs) == len({i % len(want) for i in indices})
    assert all(torch.equal(hs[i], want[i]) for i in indices)


def test_a_layer_given_its_input_by_keyword_still_gives_state_0():
    _check_hooked(_Model(_Decoder(by_keyword=True)))


def test_a_one_layer_decoder_is_read_by_hooks():
    _check_hooked(_Model(_Decoder(n=1)), indices=(0, -1))


def test_a_decoder_reached_by_get_decoder_or_language_model_is_found():
    dec = _Decoder()
    assert decoder_layout(_Model(dec, attr="language_model"))[0] is dec
    _check_hooked(_Model(dec, attr="language_model"))
    # a get_decoder with no rule for this class: the search goes on to its `model`
    assert decoder_layout(_Model(dec, get_decoder=lambda: (_ for _ in ()).throw(NotImplementedError)))[0] is dec
    other = _Decoder()
    assert decoder_layout(_Model(dec, get_decoder=lambda: other))[0] is other


@pytest.mark.parametrize("config", [{"num_hidden_layers": None}, {"num_hidden_layers": 4}, {"num_hidden_layers": 0}])
def test_a_layer_count_the_layers_do_not_match_is_no_layout(config):
    dec = _Decoder(n=3 if config["num_hidden_layers"] else 0)
    dec.config = types.SimpleNamespace(**config)
    assert decoder_layout(_Model(dec)) is None


def test_a_decoder_with_no_layers_list_is_no_layout():
    assert decoder_layout(_Model(nn.Linear(4, 4))) is None


def test_the_recorder_transformers_names_decides_the_layout():
    from transformers.utils.output_capturing import OutputRecorder

    def layout(spec, **config):
        dec = _recording(_Decoder, spec)(**config)
        return decoder_layout(_Model(dec))

    assert layout(_Layer) is not None
    assert layout(OutputRecorder(_Layer)) is not None
    assert layout(_Other) is None  # the states come from some other module than these layers
    assert layout(OutputRecorder(_Layer, index=1)) is None  # a layer output's second item
    assert layout(OutputRecorder(_Layer, layer_name="proj")) is None
    assert layout(OutputRecorder(_Layer, capture_initial_hidden_state=False)) is None
    assert layout(_Layer, tie_last_hidden_states=False) is None  # the last state is not the norm's output
    assert layout(_Layer, tie_last_hidden_states=True) is not None
    # the layer count under another config field
    spec = OutputRecorder(_Layer)
    spec.num_hidden_layers_key = "num_layers"  # set, not passed: a field transformers before 5.2x's recorder lacks
    dec = _recording(_Decoder, spec)()
    assert decoder_layout(_Model(dec)) is None
    dec.config.num_layers = 3
    assert decoder_layout(_Model(dec))[1] is dec.layers


def test_the_recorder_of_a_class_without_one_is_none():
    assert hidden._recorder(_Decoder) is None
    assert hidden._recorder(_recording(_Decoder, _Layer)) is _Layer


def test_a_config_transformers_has_no_class_for_counts_num_hidden_layers():
    """Remote-code configs: no registered class to read the layer-count field from."""
    assert state_layers(types.SimpleNamespace(num_hidden_layers=7)) == 7


def test_longcat_counts_the_field_its_recorder_names():
    """Read without hidden._recorder, so that a wrong one fails here rather than skipping."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        cfg = AutoConfig.for_model("longcat_flash", num_layers=3)
    except ValueError:
        pytest.skip("this transformers has no longcat_flash")
    spec = getattr(MODEL_MAPPING[type(cfg)], "_can_record_outputs", {}).get("hidden_states")
    if getattr(spec, "num_hidden_layers_key", None) != "num_layers":
        pytest.skip("this transformers records no layer-count key for LongCat's hidden states")
    assert cfg.num_hidden_layers == 6 and state_layers(cfg) == 3


class _BareDecoder(_Decoder):
    """Returns its last state as a bare tensor: no last_hidden_state for the final hook to read."""

    def forward(self, x, output_hidden_states=False):
        return super().forward(x).last_hidden_state


def test_a_final_state_the_decoder_does_not_return_is_an_error_naming_it():
    with pytest.raises(LabError, match="^hidden state 3: the model's decoder passed a NoneType, not a tensor$"):
        run_capturing(_Model(_BareDecoder()), [1], x=_x())


class _Deaf(nn.Module):
    """Remote code with no decoder the hooks can find, that ignores output_hidden_states."""

    def forward(self, x, output_hidden_states=False):
        return BaseModelOutput(last_hidden_state=x)


def test_a_model_that_ignores_output_hidden_states_is_one_line_naming_it():
    """Before: len(None)'s TypeError traceback."""
    assert decoder_layout(_Deaf()) is None  # so the whole forward is asked for its states
    with pytest.raises(LabError, match="^_Deaf returned no hidden states for output_hidden_states=True"):
        run_capturing(_Deaf(), [0], x=_x())
