"""How `data prepare` turns conversations into feature shards. Kept apart from capture.py so that the
command-line parsers read these defaults without importing torch."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import sys
from dataclasses import dataclass

DTYPE_NAMES = ("float32", "bfloat16", "float16")
"""The dtypes a target may run in (capture.DTYPES maps them to torch's)."""
TURNS = ("all", "last", "each")
"""Which assistant turns of a conversation train (CaptureConfig.turns)."""


@dataclass
class CaptureConfig:
    """How `data prepare` turns conversations into feature shards."""

    aux_layer_ids: list[int] | None = None
    """Three HF hidden_states indices to capture (0 = embeddings); default [2, L//2, L-3]."""
    max_length: int = 512
    """Tokens per sequence after the chat template; longer conversations are cut."""
    dtype: str = "float32"
    """Dtype the target runs in and the hidden states are stored in: float32, bfloat16, float16."""
    batch_size: int = 8
    """Sequences per target forward pass."""
    shard_size: int = 256
    """Sequences per shard file (the unit of resume)."""
    val_fraction: float = 0.1
    """Fraction of sequences held out for validation, chosen by a hash of the sequence id."""
    regenerate: bool = False
    """Replace assistant turns with the target's own generations before capture, and answer each user turn
    without one (a file of prompts alone, SpecForge's input for regenerating), as `data regenerate` does."""
    temperature: float = 0.0
    """Sampling temperature for regeneration (0 = greedy)."""
    max_new_tokens: int = 128
    """Longest regenerated assistant turn, in tokens."""
    regen_batch_size: int = 16
    """Prompts per generate call during regeneration."""
    seed: int = 0
    """Seed for sampled regeneration."""
    token_exact: bool = False
    """Keep each answer as the tokens the target sampled (regenerated here, or the `token_ids` of a
    `data regenerate` output, locally or through a server that returns them) instead of re-tokenizing
    its text, as a server streams them. Held-out sets for `train --val-temperature` need it for the
    replay of a sampled server (replay_accept_len_k)."""
    turns: str = "all"
    """Which assistant turns train. `all`: one sequence per conversation, every turn as the target's later
    prompts show it and the last as it was served. `last`: the last turn alone, the conversation cut after
    it (SpecForge's --train-only-last-turn). `each`: one sequence per assistant turn, cut after it and
    training it alone (id `<conversation id>#turn<k>`, in its conversation's split), so every turn trains
    as served, its thinking too where the template hides it from later prompts (DeepSeek-R1's, Qwen3's,
    Kimi's); the target then runs over every prefix, tokens quadratic in the turns. Under `last` and
    `each` a turn past `max_length` has no sequence, nor (token-exact) a turn of calls kept as recorded;
    token-exact, the turns before the trained one are their text tokenized, as a server reads them."""
    chat_template_kwargs: dict | None = None
    """Extra variables for the target's chat template, as an SGLang or vLLM request's
    `chat_template_kwargs` (`{"enable_thinking": false}`: a hybrid thinking model served with its
    thinking off); the regeneration's prompts and the captured sequences both see them. The lab's own
    `template_date` ("YYYY-MM-DD") is the day a template that reads the clock renders as today
    (TEMPLATE_DATE)."""
    tokenize_workers: int = 1
    """Processes that render and tokenize the conversations (chat template and loss mask; quadratic in
    a conversation's turns, so long agent traces cost more here than in the target); 1: this one.
    Under torchrun, per rank."""
    strict: bool = False
    """Treat a conversation without an assistant turn (with `regenerate`, without a user or assistant turn),
    or one the chat template refuses (or writes so that a turn cannot be placed: DeepSeek-V3's, a second
    turn of tool calls), as an error instead of skipping it."""
    device: str = "cpu"
    """Device for the target (ignored under torchrun, where each rank takes its own)."""


# apply_chat_template's own arguments, and the template's `messages`: not for a template variable to set.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})


def _not_json_number(name: str):
    """json.loads' parse_constant: NaN, Infinity and -Infinity, which Python's json reads and JSON has not."""
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """json.loads' parse_float, refusing a number past a double's range (1e999), which would read as inf."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a double's range")
    return value


def _whole_number(text: str) -> int:
    """json.loads' parse_int, naming a number past Python's digit limit (its own message suggests a setting)."""
    digits, limit = len(text.lstrip("-")), sys.get_int_max_str_digits()
    if 0 < limit < digits:  # a limit of 0 is none (PYTHONINTMAXSTRDIGITS=0)
        raise ValueError(f"a number of {digits} digits is past Python's {limit}-digit limit")
    return int(text)


def _shown(text: str, width: int = 80) -> str:
    """The flag's text for a message: whole if short, else its start and its length."""
    return repr(text) if len(text) <= width else f"{text[:width]!r}... ({len(text)} characters)"


def template_kwargs_arg(text: str) -> dict:
    """`--chat-template-kwargs JSON`: a JSON object of chat template variables, its numbers finite: the
    template would see a NaN that the manifest records as null, and a later run given null would match it."""
    try:
        kwargs = json.loads(text, parse_constant=_not_json_number, parse_float=_finite_float, parse_int=_whole_number)
    except (json.JSONDecodeError, RecursionError):  # the latter: nesting too deep
        kwargs = None
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"{e}: chat template variables take finite numbers, got {_shown(text)}") from None
    if not isinstance(kwargs, dict):
        raise argparse.ArgumentTypeError(
            f'expected a JSON object like \'{{"enable_thinking": false}}\', got {_shown(text)}')
    if clash := sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys()):
        raise argparse.ArgumentTypeError(f"{', '.join(clash)}: apply_chat_template's own argument, not a template "
                                         "variable")
    if TEMPLATE_DATE in kwargs:
        try:
            template_date(kwargs[TEMPLATE_DATE])
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return kwargs


TEMPLATE_DATE = "template_date"
"""The lab's own chat template variable: the day ("YYYY-MM-DD") that a template reading the clock
(`strftime_now`: Llama 3.2's and 3.3's "Today Date", Mistral Small 3.1's) renders as today. A run
picks it once (chat.pinned: the day of the work it resumes or whose answers it takes, else today)
and records it with the rest of its chat_template_kwargs, so that a resume or reproduce on another
day renders the same text; chat.render pins the clock to it and passes it to no template."""


def template_date(value) -> datetime.date:
    """A TEMPLATE_DATE value as a day; ValueError, in one line, for anything but a YYYY-MM-DD day."""
    try:
        if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return datetime.date.fromisoformat(value)
    except ValueError:
        pass
    raise ValueError(f"{TEMPLATE_DATE} must be a day written YYYY-MM-DD, got {value!r}")


def recorded_kwargs_problem(kwargs) -> str | None:
    """What makes a record's template variables unreadable (a `rendered_with`'s, a manifest's): not an object,
    or a day that is no day; None where they read (null: none)."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        return f"chat_template_kwargs is {type(kwargs).__name__}, not an object"
    try:
        if TEMPLATE_DATE in kwargs:
            template_date(kwargs[TEMPLATE_DATE])
    except ValueError as e:
        return str(e)
    return None


def template_setting(kwargs: dict | None) -> dict:
    """`{"chat_template_kwargs": kwargs}` where there are any, else {}: the settings, identities and
    requests of runs without them stay as they were, so older journals and manifests still resume."""
    return {"chat_template_kwargs": kwargs} if kwargs else {}


TEMPLATE_HASH = "chat_template_sha256"
"""The key under which manifests, journals, run identities and eval configs name the chat template
the text was rendered with (chat.template_sha256)."""
TOKENIZER_HASH = "tokenizer_sha256"
"""The key under which they name the tokenizer that turned that text into ids (chat.tokenizer_sha256)."""
ENCODED_HASH = "encoded_sha256"
"""The key under which an online run names what its conversations encoded to (sources.encoded_sha256):
another lab or transformers version can encode the same text to other tokens or loss masks."""

STOP_IDS = "stop_token_ids"
"""The key under which a regeneration names the ids that end an answer (hf.stop_token_ids): a model's
generation_config.json can add one (Llama 3's <|eot_id|>) with its weights, config and tokenizer unchanged."""

RECORDED_SINCE = {TEMPLATE_HASH: ("chat templates", "template"), TOKENIZER_HASH: ("tokenizers", "tokenizer"),
                  ENCODED_HASH: ("encodings", "encoding"), STOP_IDS: ("stop token sets", "stop token set")}
"""Keys the lab began to record once work could already have been made without them (templates on
2026-12-02, tokenizers and online runs' encodings on 2026-12-03, regenerations' stop tokens on
2026-12-04), oldest first, with what they name."""


def device_setting(device) -> dict:
    """A run's device type where it decides its output (a GPU rounds otherwise, so even greedy answers
    and captured states differ); nothing for the CPU, so settings recorded before it counted still match."""
    return {} if device.type == "cpu" else {"device": device.type}


def unrecorded(before: dict, now: dict) -> list[str]:
    """The keys of RECORDED_SINCE that `now` holds and `before` lacks: made before the lab recorded them.
    A capture that did not regenerate (`regenerate` None) records no stop tokens in any version: it
    lacks them as it would now, and the settings that differ say so."""
    plain = "regenerate" in before and before["regenerate"] is None
    return [k for k in RECORDED_SINCE if k in now and k not in before and not (plain and k == STOP_IDS)]


def without(settings: dict, keys) -> dict:
    """`settings` less `keys`."""
    return {k: v for k, v in settings.items() if k not in keys}


def as_recorded(before: dict | None, now: dict, where) -> dict:
    """`now` without the keys `before` (the settings of a manifest, journal or run at `where`) was made
    without: work begun before the lab recorded its template or tokenizer resumes unchecked on
    those, as it did, rather than being refused and made again."""
    unseen = unrecorded(before, now) if before is not None else []
    if not unseen:
        return now
    from drafter_lab.progress import log

    what, its = (_listed([RECORDED_SINCE[k][i] for k in unseen]) for i in (0, 1))
    log(f"{where}: begun before the lab recorded {what}, so its {its} {'is' if len(unseen) == 1 else 'are'} "
        "not checked")
    return without(now, unseen)


def _listed(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))
