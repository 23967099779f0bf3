"""Feature capture: run the target over conversations and write EAGLE-3 training shards.

Per sequence the shard holds input_ids, the assistant loss mask, the three aux hidden states
(HF `output_hidden_states` indices, default [2, L//2, L-3]) concatenated, and the last hidden state
(target logits are recomputed from it with the target's lm_head, never stored). See shards.py.

Determinism and resume: conversations keep file order, the train/val split is a hash of the
conversation id (a conversation's sequences share its split), shard k of a split always holds the
same sequences, and batches inside a shard are formed the same way every run, so a rerun recomputes
exactly the shards the manifest does not list and skips the rest. A manifest made from another
target, chat template or settings is refused. Regenerated conversations are cached beside the shards
(`regenerated-<hash>.jsonl`, named by what decides the answers and journalled batch by batch while
they are generated), so a resumed run, or one with other capture settings, does not generate again.
A user turn without an answer, or a tool result that ends a conversation, gets the target's there
(regenerate.answer_slots; a file of prompts alone, SpecForge's input, is read as prompts), so the
capture is that of `data regenerate` then `data prepare`.
Memory holds one batch of hidden states: each sequence is written into its shard (laid out from the
planned lengths) as its batch finishes.

Targets that do not fit one device: launch the same command under torchrun, e.g.

    torchrun --nproc_per_node 8 -m drafter_lab data prepare --target DIR --conversations F --out D

With WORLD_SIZE > 1 the target loads with transformers' tensor-parallel plan (`tp_plan="auto"`:
attention heads and MLP columns split over the ranks, one all-reduce per row-parallel layer; needs
the `accelerate` package and a model class with a `base_model_tp_plan`, which Llama, Qwen2/3,
Mistral, DeepSeek and most causal LMs have). Every rank runs every forward (hidden states come out
whole after the all-reduces); rank 0 alone writes shards, cache and manifest. CUDA ranks use NCCL
and one GPU each (LOCAL_RANK); on CPU, gloo.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from pathlib import Path

import torch

from drafter_lab import atomic
from drafter_lab import config as cfglib
from drafter_lab.data.capture_config import (
    DTYPE_NAMES,
    RECORDED_SINCE,
    STOP_IDS,
    TEMPLATE_HASH,
    TOKENIZER_HASH,
    TURNS,
    CaptureConfig,
    as_recorded,
    device_setting,
    unrecorded,
    without,
)
from drafter_lab.data.chat import TemplateRefusal, pinned, rendered_with
from drafter_lab.data.conversations import (
    Conversation,
    conversations_sha256,
    read_conversations,
    write_conversations,
)
from drafter_lab.data.encodings import encodings
from drafter_lab.data.regenerate import SAMPLER, answerable, answers_prompts, regenerate
from drafter_lab.data.shards import (
    MANIFEST,
    SPLITS,
    Manifest,
    Sequence,
    ShardWriter,
    is_shard_name,
    shard_name,
    stored_text,
)
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.progress import log, maybe_progress
from drafter_lab.targets.fingerprint import fingerprint
from drafter_lab.targets.hf import (
    MODEL_JSON,
    Target,
    broken_file,
    check_aux_layer_ids,
    check_loading_info,
    check_shards,
    default_aux_layer_ids,
    first_line,
    load_target,
    load_tokenizer,
    model_class,
    pad_token_id,
    quiet_transformers,
    remote_code_refusal,
    stop_token_ids,
    trusts_remote_code,
)
from drafter_lab.targets.hidden import run_capturing

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


TURN_ID = re.compile(r"#turn\d+\Z")
"""The suffix of a sequence cut after one assistant turn (`turns="each"`)."""


def conversation_of(seq_id: str) -> str:
    """The id of the conversation a sequence comes from."""
    return TURN_ID.sub("", seq_id)


def split_of(seq_id: str, val_fraction: float) -> str:
    """"train" or "val", by a hash of the sequence's conversation id: a conversation's sequences share
    its split, so no val answer sits in a train sequence's prompt."""
    h = int(hashlib.sha256(conversation_of(seq_id).encode()).hexdigest()[:16], 16)
    return "val" if h < val_fraction * 2**64 else "train"


def _dist_rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def pinned_by_rank0(tokenizer, template_kwargs: dict | None, recorded=()) -> dict | None:
    """chat.pinned, as rank 0 picked it, on every rank of a torchrun group (each rank calls this): each clock
    could name its own day (ranks past the pick on either side of midnight, nodes in other time zones), and a
    rank would render other tokens than rank 0 records (an online rank trained on them, a tensor-parallel
    capture all-reduced states of two texts)."""
    kwargs = pinned(tokenizer, template_kwargs, recorded)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        box = [kwargs]
        torch.distributed.broadcast_object_list(box, src=0)
        kwargs = box[0]
    return kwargs


def _load_tp_target(path: Path, dtype: torch.dtype) -> Target:
    """Load with transformers' tensor-parallel plan; torch.distributed starts from torchrun's env."""
    from transformers import AutoConfig

    try:
        from transformers import DistributedConfig

        tp = {"distributed_config": DistributedConfig(tp_plan="auto")}
    except ImportError:  # transformers 4.x takes the plan directly
        tp = {"tp_plan": "auto"}
    fp = fingerprint(path)  # one-line error for a directory without config.json
    check_shards(path)
    try:
        whole = AutoConfig.from_pretrained(str(path), trust_remote_code=trusts_remote_code())
    except Exception as e:
        raise remote_code_refusal(e, path, "config") or LabError(f"cannot read the model config: {first_line(e)}",
                                                                 path) from None
    world = int(os.environ["WORLD_SIZE"])
    config = whole.get_text_config()
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % world or kv % world:  # else every rank fails deep in the attention with a raw traceback
        raise LabError(f"{world} ranks do not divide the target's {heads} attention heads and {kv} key/value heads: "
                       "run tensor-parallel capture on a divisor of both", path)
    try:
        with quiet_transformers(load_report=False):
            model, info = model_class(whole).from_pretrained(
                str(path), dtype=dtype, local_files_only=True, trust_remote_code=trusts_remote_code(),
                output_loading_info=True, ignore_mismatched_sizes=True, **tp)  # refused by name, as load_target does
    except Exception as e:
        raise (remote_code_refusal(e, path, "model") or broken_file(path, MODEL_JSON, weights=True)
               or LabError(f"cannot load model tensor-parallel: {first_line(e)}", path)) from None
    check_loading_info(info, path)
    model.eval().requires_grad_(False)
    return Target(path=path, model=model, tokenizer=load_tokenizer(path), fingerprint=fp)


def check_config(cfg: CaptureConfig) -> None:
    if cfg.dtype not in DTYPES:
        raise LabError(f"unknown dtype {cfg.dtype!r}; choose one of {', '.join(DTYPES)}")
    for name in ("max_length", "batch_size", "shard_size", "max_new_tokens", "regen_batch_size", "tokenize_workers"):
        if getattr(cfg, name) < 1:
            raise LabError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise LabError(f"val_fraction must be in [0, 1), got {cfg.val_fraction}")
    if not 0 <= cfg.temperature < math.inf:  # nan too, which sampling would meet as a traceback
        raise LabError(f"temperature must be a finite number >= 0, got {cfg.temperature}")
    cfglib.check_seed(cfg.seed)
    if cfg.turns not in TURNS:
        raise LabError(f"unknown turns {cfg.turns!r}; choose one of {', '.join(TURNS)}")


def sequences_of(convs: list[Conversation], turns: str, token_exact: bool = False) -> list[Conversation]:
    """The conversations to encode for `turns` (CaptureConfig.turns): `all` as they are; `last` each cut
    after its last assistant turn; `each` one per assistant turn, cut after it. `token_exact`, a turn of
    tool calls kept as recorded (no `token_ids`) trains nothing, so it is passed over: no target forward
    is spent on it."""
    if turns == "all":
        return convs
    out = []
    for c in convs:
        at = [(k, i) for k, i in enumerate(c.assistant_turns(), 1)
              if not (token_exact and "tool_calls" in c.messages[i] and "token_ids" not in c.messages[i])]
        if turns == "last":
            out += [Conversation(c.id, c.messages[:i + 1], c.tools) for _, i in at[-1:]]
        else:
            out += [Conversation(f"{c.id}#turn{k}", c.messages[:i + 1], c.tools) for k, i in at]
    return out


def resume_settings(target: dict, aux_ids: list[int], dtype: str, source: dict) -> dict:
    """What must match for a rerun to resume (paths may move; content hashes may not)."""
    return {
        "target fingerprint": target["fingerprint"],
        "aux_layer_ids": list(aux_ids),
        "dtype": dtype,
        **{k: v for k, v in source.items() if k not in ("conversations", "dir", "planned")},
    }


def check_resumable(out: Path, existing: Manifest, now: dict) -> None:
    before = resume_settings(existing.target, existing.aux_layer_ids, existing.dtype, existing.source)
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            raise LabError(
                f"manifest was made with other settings ({key}: {before.get(key)!r} there, "
                f"{now.get(key)!r} now); use another --out or delete it",
                out / MANIFEST,
            )


def check_out_dir(out: Path) -> None:
    """An existing --out without a manifest may only hold what an earlier run of ours left: a run
    killed before its first manifest leaves a regeneration, temps, and perhaps its first shard."""
    if out.exists() and not out.is_dir():
        raise LabError("output path exists and is not a directory", out)
    atomic.refuse_below_file(out)
    if not out.is_dir() or (out / MANIFEST).exists():
        return
    foreign = [
        p.name
        for p in out.iterdir()
        if not (p.name.startswith("regenerated-") or p.name.startswith(".") or is_shard_name(p.name))
    ]
    if foreign:
        raise LabError(f"output directory holds other files ({', '.join(sorted(foreign)[:3])}) and no manifest", out)


REGENERATION_KEYS = ("target fingerprint", "dtype", "device", "sha256", "regenerate", TEMPLATE_HASH,
                     "chat_template_kwargs", TOKENIZER_HASH, STOP_IDS)
"""What of a capture's settings (resume_settings) decides its regenerated answers: the target, the dtype and
device type it runs in (a GPU rounds otherwise, so even greedy answers can differ; the CPU is recorded as no
device, so caches made before it counted are still found), the conversations, the sampling (`regenerate`; its
batch size too, as padding can flip near-ties), how prompts are rendered and tokenized, and the tokens that end
an answer. The rest (max_length, turns, token_exact, the split, shard and capture batch sizes, aux ids) acts on
the answers once written: changing it reuses them."""


def _partial(cache: Path) -> Path:
    return cache.with_name(cache.name + ".partial")


def _regeneration(out: Path, settings: dict) -> tuple[Path, dict]:
    """Where a regeneration for `settings` (resume_settings) is cached, and the settings its journal records:
    those of REGENERATION_KEYS, or all of `settings` where a lab that named it by them began it."""
    named = [{k: v for k, v in settings.items() if k in REGENERATION_KEYS}, settings]
    caches = [(out / f"regenerated-{atomic.sha256_json(s)[:12]}.jsonl", s) for s in named]
    return next(((c, s) for c, s in caches if c.exists() or _partial(c).exists()), caches[0])


def _rendered_before(out: Path, existing: Manifest | None, convs: list[Conversation]):
    """How the work a capture at `out` goes on with was rendered (settings with the chat template's hash
    and variables, chat.pinned): the manifest it resumes, else a regeneration begun there (its journal,
    or its cached output's first answers), then the answers it reads sampled after the target's prompts."""
    if existing is not None:
        yield existing.source
    for cache in sorted(out.glob("regenerated-*.jsonl*")) if existing is None and out.is_dir() else ():
        if cache.name.endswith(".partial"):
            yield Journal.settings_of(cache)
        else:
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                with open(cache, "rb") as f:
                    yield from (m.get("rendered_with") for m in json.loads(f.readline())["conversations"])
    yield from (m.get("rendered_with") for c in convs for m in c.messages)


def _regeneration_begun(out: Path, settings: dict) -> bool:
    cache = _regeneration(out, settings)[0]
    return cache.exists() or _partial(cache).exists()


def _earlier_settings(out: Path, existing: Manifest | None, settings: dict) -> dict | None:
    """The settings of the work `out` holds: its manifest's, else those of a regeneration (cached, or
    its journal) named without the hashes the lab recorded since it began (RECORDED_SINCE)."""
    if existing is not None:
        return resume_settings(existing.target, existing.aux_layer_ids, existing.dtype, existing.source)
    if _regeneration_begun(out, settings):
        return None
    later = [k for k in RECORDED_SINCE if k in settings]  # online runs' encodings are no capture setting
    older = (without(settings, later[i:]) for i in reversed(range(len(later))))
    return next((s for s in older if _regeneration_begun(out, s)), None)


def _described(target: Target, out: Path, existing: Manifest | None, aux_ids: list[int], dtype: str,
               source: dict) -> dict:
    """target.describe() under the name `out`'s work knows it by: a capture or regeneration begun by a lab
    that fingerprinted targets the older way (targets/fingerprint.py) resumes under that name."""
    now = target.describe()
    legacy = {**now, "fingerprint": target.legacy_fingerprint}
    if existing is not None:
        return legacy if existing.target.get("fingerprint") == legacy["fingerprint"] else now
    begun = [_regeneration_begun(out, resume_settings(d, aux_ids, dtype, source)) for d in (now, legacy)]
    if begun[0] or not (begun[1] or _earlier_settings(out, None, resume_settings(legacy, aux_ids, dtype, source))):
        return now
    return legacy


def _conversations(target, convs, cfg: CaptureConfig, out: Path, settings: dict, main: bool) -> list[Conversation]:
    if not cfg.regenerate:
        return convs
    cache, recorded = _regeneration(out, settings)
    if cache.exists():
        log(f"regenerate: reusing {cache}")
        return read_conversations(cache, strict=True)[0]
    with Journal(_partial(cache), recorded, write=main) as journal:
        convs = regenerate(
            target,
            convs,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.regen_batch_size,
            seed=cfg.seed,
            template_kwargs=cfg.chat_template_kwargs,
            show_progress=main,
            journal=journal,
        )
    if main:
        write_conversations(cache, convs)
        journal.discard()
    return convs


def _rendered_otherwise(message: dict, ours: dict) -> bool:
    """An answer sampled after a prompt rendered otherwise than `ours` (on what it records of it)."""
    theirs = message.get("rendered_with", ours)
    return theirs != without(ours, unrecorded(theirs, ours))


def tokenize_conversations(target: Target, convs, cfg: CaptureConfig, conversations_path, skipped: dict,
                           main: bool) -> list[tuple]:
    """(id, input_ids, loss_mask) per sequence (one per conversation, or per assistant turn: `cfg.turns`)
    with an assistant token within max_length, of those the chat template renders so that their turns
    are placed (chat.TemplateRefusal: an error under `cfg.strict`); the others are counted in
    `skipped`. Answers another target sampled (a regeneration by the previous model version, say), or sampled after prompts
    rendered otherwise than here (another chat template, other variables), are an error token-exact
    and a note on `main` otherwise; so is reasoning the chat template leaves out of the turns that
    train (a note: those turns train on their answers alone), and tool calls it
    does not write (a note: a template without tool support, or one writing a turn's first call
    alone). Encoded in `cfg.tokenize_workers` processes (encodings.py), with progress on `main`."""
    items = []
    end_ids = frozenset(stop_token_ids(target))
    mine = target.fingerprint
    foreign: dict[str, str] = {}  # conversation id -> the other target that sampled its answers
    ours, reprompted = rendered_with(target.tokenizer, cfg.chat_template_kwargs), 0
    thought = dropped = 0  # assistant turns with reasoning, and those the template leaves it out of
    calling = uncalled = 0  # assistant turns making tool calls, and those the template does not write
    for conv in convs:
        other = {fp for m in conv.messages if not target.known_as(fp := m.get("target_fingerprint", mine))}
        if other and cfg.token_exact:
            raise LabError(f"conversation {conv.id}: answers sampled by target {other.pop()}, not by this one ({mine}): "
                           "a token-exact capture takes the target's own tokens only", conversations_path)
        if other:
            foreign[conv.id] = min(other)
        theirs = next((m["rendered_with"] for m in conv.messages if _rendered_otherwise(m, ours)), None)
        if theirs is not None and cfg.token_exact:
            raise LabError(f"conversation {conv.id}: answers sampled after prompts rendered with {theirs}, not as "
                           f"here ({ours}): a token-exact capture takes the target's own tokens after its own prompts "
                           "(the same chat template and --chat-template-kwargs)", conversations_path)
        reprompted += theirs is not None
    seqs = sequences_of(convs, cfg.turns, cfg.token_exact)
    refused: list[str] = []  # what the chat template refused, per sequence skipped for it
    try:
        for conv, out in zip(seqs, encodings(seqs, target.tokenizer, cfg, end_ids, main)):
            if isinstance(out, TemplateRefusal):
                refused.append(str(out))
                continue
            ids, mask, (n, d), (c, u) = out
            thought, dropped, calling, uncalled = thought + n, dropped + d, calling + c, uncalled + u
            if not mask.any():  # the assistant text lies past max_length
                skipped["no_loss_tokens_within_max_length"] = skipped.get("no_loss_tokens_within_max_length", 0) + 1
                continue
            items.append((conv.id, ids, mask))
    except LabError as e:
        raise LabError(str(e), conversations_path) from None
    if refused:
        skipped[TEMPLATE_REFUSES] = skipped.get(TEMPLATE_REFUSES, 0) + len(refused)
        if main:
            log(f"{conversations_path}: skipped {len(refused)} of {len(seqs)} sequences the chat template refuses or "
                f"writes so that a turn cannot be placed (first: {refused[0]}); --strict makes it an error")
    if foreign and main:
        log(f"{conversations_path}: {len(foreign)} of {len(convs)} conversations hold answers target(s) "
            f"{', '.join(sorted(set(foreign.values())))} sampled, not this one ({mine}): they train as text, "
            "not as this target's own answers")
    if reprompted and main:
        log(f"{conversations_path}: {reprompted} of {len(convs)} conversations hold answers sampled after prompts "
            f"rendered otherwise than here ({ours}): they train as text")
    if dropped and main:
        log(f"{conversations_path}: the chat template leaves out the reasoning of {dropped} of {thought} assistant "
            "turns that carry it (as it shows the target earlier turns, or never): they train on their answers alone")
    if uncalled and main:
        log(f"{conversations_path}: the chat template leaves out tool calls of {uncalled} of {calling} assistant "
            "turns that make them (one without tool support writes none, the lab's default ChatML among them; "
            "GPT-OSS's writes a turn's first call alone): they train without those calls, and the turns after "
            "them read as if those tools were not called")
    return items


TEMPLATE_REFUSES = "chat_template_refuses"
"""The key under which `skipped` counts the sequences the chat template refuses (chat.TemplateRefusal)."""


def capture_states(target: Target, items: list[tuple], aux_ids: list[int], dtype, batch_size: int, advance, put):
    """Run the target over `items` (id, input_ids, loss_mask), `batch_size` at a time (longest first,
    right-padded), and `put(j, seq)` each item's states as its batch finishes."""
    pad = pad_token_id(target)
    order = sorted(range(len(items)), key=lambda j: -len(items[j][1]))
    for b in range(0, len(order), batch_size):
        chunk = order[b : b + batch_size]
        width = len(items[chunk[0]][1])
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, j in enumerate(chunk):
            n = len(items[j][1])
            ids[r, :n] = items[j][1]
            attn[r, :n] = 1
        with torch.no_grad():  # the aux and final states alone: all L+1 of a batch is 8x the memory
            _, hs = run_capturing(target.model, aux_ids, input_ids=ids.to(target.device),
                                  attention_mask=attn.to(target.device), use_cache=False, logits_to_keep=1)
        aux = torch.cat([hs[i] for i in aux_ids], dim=-1)
        for r, j in enumerate(chunk):
            seq_id, seq_ids, mask = items[j]
            n = len(seq_ids)
            seq = Sequence(
                seq_id=seq_id,
                input_ids=seq_ids,
                loss_mask=mask,
                aux_hidden=aux[r, :n].to("cpu", dtype).clone(),
                final_hidden=hs[-1][r, :n].to("cpu", dtype).clone(),
            )
            if not (torch.isfinite(seq.aux_hidden).all() and torch.isfinite(seq.final_hidden).all()):
                raise LabError(
                    f"target produced NaN/inf hidden states on sequence {seq_id} in {str(dtype).removeprefix('torch.')}", target.path
                )
            put(j, seq)
        del hs, aux
        advance(len(chunk), tokens=int(attn.sum()))


def temperature_of(convs: list[Conversation]) -> float | None:
    """The temperature every sampled assistant turn of `convs` (one with `token_ids`) was sampled at, if
    one is recorded for all. A turn of tool calls that regeneration keeps as recorded was not sampled."""
    temps = {m.get("temperature") for c in convs for m in c.messages if m["role"] == "assistant" and "token_ids" in m}
    return temps.pop() if len(temps) == 1 else None  # {None}: none recorded


def _source(cfg: CaptureConfig, conversations_path: Path, convs: list[Conversation], target: Target) -> dict:
    """Where the sequences come from and every setting that changes their content."""
    regen = ("temperature", "max_new_tokens", "regen_batch_size", "seed")
    # Answers regenerated before (`data regenerate`, locally or through a server) say how they were sampled.
    given = temperature_of(convs) if cfg.token_exact and not cfg.regenerate else None
    return {
        "conversations": str(conversations_path),
        "sha256": conversations_sha256(conversations_path),
        "max_length": cfg.max_length,
        "val_fraction": cfg.val_fraction,
        "shard_size": cfg.shard_size,
        "batch_size": cfg.batch_size,  # padding inside a batch moves the low bits of the states
        "regenerate": ({**{k: getattr(cfg, k) for k in regen}, **SAMPLER, **answers_prompts(convs)}
                       if cfg.regenerate else None),
        **({"token_exact": True} if cfg.token_exact else {}),  # absent otherwise: older manifests still resume
        **({"turns": cfg.turns} if cfg.turns != "all" else {}),  # likewise
        **rendered_with(target.tokenizer, cfg.chat_template_kwargs),
        **({STOP_IDS: stop_token_ids(target)} if cfg.regenerate else {}),
        **({"sampled_at": given} if given is not None else {}),
        **device_setting(target.device),
    }


def sampled_at(source: dict) -> float | None:
    """The temperature at which a manifest's assistant tokens are the target's own samples (a
    token-exact capture of a regeneration), else None."""
    regen = source.get("regenerate")
    if source.get("token_exact") and regen:
        return float(regen["temperature"])
    return float(source["sampled_at"]) if "sampled_at" in source else None


def plan_shards(items: list[tuple], val_fraction: float, shard_size: int) -> dict[str, list[list[tuple]]]:
    """Per split, the items (id first) of each shard, in input order: the same on every run."""
    by_split = {s: [it for it in items if split_of(it[0], val_fraction) == s] for s in SPLITS}
    return {s: [seqs[k : k + shard_size] for k in range(0, len(seqs), shard_size)] for s, seqs in by_split.items()}


@contextlib.contextmanager
def _removed_if_empty(out: Path, fresh: bool):
    """A run that fails before its first shard lands leaves no directory behind (a shard's temp file
    lives in `out` while it is written)."""
    try:
        yield
    except BaseException:
        if fresh:
            with contextlib.suppress(OSError):
                out.rmdir()  # only an empty one
        raise


def _holds_as_planned(path: Path, chunk: list[tuple]) -> bool:
    """The shard at `path` can be read and holds `chunk`'s items (id, input_ids, loss_mask): the same
    ids, tokens and loss masks."""
    try:
        seq_ids, ids, mask, offsets = stored_text(path)
    except LabError:
        return False
    lengths = torch.tensor([len(it[1]) for it in chunk])
    return (seq_ids == [it[0] for it in chunk] and torch.equal(offsets[1:], lengths.cumsum(0))
            and torch.equal(ids.long(), torch.cat([it[1] for it in chunk]))
            and torch.equal(mask.bool(), torch.cat([it[2] for it in chunk])))


def _kept(out: Path, existing: Manifest, plan: dict, holds, main: bool) -> dict[str, list[dict]]:
    """The rows of `existing`'s shards to keep: those on disk that, where `holds(path, chunk)` is
    given, hold what the plan puts there now. A capture resumed with another lab or transformers
    version can encode its conversations otherwise (another loss mask, say): such shards are
    computed again rather than mixed with new ones."""
    rows = {s: [r for r in existing.shards.get(s, []) if (out / r["file"]).exists()] for s in SPLITS}
    if holds is None:
        return rows
    chunks = {shard_name(s, k): chunk for s in SPLITS for k, chunk in enumerate(plan[s])}
    kept = {s: [r for r in rs if r["file"] in chunks and holds(out / r["file"], chunks[r["file"]])]
            for s, rs in rows.items()}
    written = sum(map(len, rows.values()))
    stale = written - sum(map(len, kept.values()))
    if stale and main:
        log(f"{out}: {stale} of {written} shards written hold other sequences, tokens or loss "
            "masks than the conversations encode to now (another lab or transformers version), or cannot be read: "
            "computing them again")
    return kept


def write_planned(out: Path, manifest: Manifest, existing: Manifest | None, plan: dict, dtype: torch.dtype,
                  length, compute, main: bool = True, what: str = "capture", holds=None) -> Manifest:
    """Write each planned shard that `existing` does not list yet (or, where `holds` says, lists
    holding other items: `_kept`), then the manifest, shard by shard (a killed run resumes from
    there). `length(item)` is an item's token count, which lays out its shard; `compute(chunk,
    advance, put)` calls `put(j, seq)` once for each item of the chunk, in any order, and each
    sequence goes to disk then. Only the main rank writes."""
    planned = {s: {"sequences": sum(map(len, plan[s])), "shards": len(plan[s])} for s in SPLITS}
    manifest.source["planned"] = planned
    if existing is not None and existing.source.get("planned") != planned:
        raise LabError(f"manifest plans {existing.source.get('planned')} but this run plans {planned}: the same input "
                       "now makes other sequences (another lab or transformers version); use another --out or delete it",
                       out / MANIFEST)
    if existing is not None:
        manifest.shards = _kept(out, existing, plan, holds, main)
        if main and manifest.shards != existing.shards:  # else a run killed once a dropped shard landed again
            manifest.save(out)  # would resume keeping its old row (sha256, loss_tokens)
    done = {r["file"] for rows in manifest.shards.values() for r in rows}
    todo = [(s, k, chunk) for s in SPLITS for k, chunk in enumerate(plan[s]) if shard_name(s, k) not in done]
    if main:
        log(
            f"{what}: {sum(p['sequences'] for p in planned.values())} sequences (train {planned['train']['sequences']}, "
            f"val {planned['val']['sequences']}), {sum(p['shards'] for p in planned.values())} shards, "
            f"{len(todo)} to compute; aux ids {manifest.aux_layer_ids}"
        )
    fresh = not out.exists()
    if main:  # the half-written shard of a killed run (every shard that landed is in the manifest)
        for stale in out.glob(".*.safetensors.*.tmp"):
            stale.unlink()
    with maybe_progress(what, sum(len(c) for _, _, c in todo), main) as advance, _removed_if_empty(out, fresh):
        for split, k, chunk in todo:
            if not main:
                compute(chunk, advance, lambda j, seq: None)
                continue
            with ShardWriter(out, split, k, [it[0] for it in chunk], [length(it) for it in chunk],
                             manifest.target["hidden_size"], dtype) as shard:
                compute(chunk, advance, shard.put)
            manifest.shards[split] = sorted([*manifest.shards[split], shard.row], key=lambda r: r["file"])
            manifest.save(out)
    return manifest


def prepare_features(
    target_path, conversations_path, out_dir, config: CaptureConfig | None = None, **overrides
) -> Manifest:
    """Capture features of `conversations_path` through the target into `out_dir`; returns the manifest.

    Settings come from `config` (default CaptureConfig()) with keyword `overrides` on top, e.g.
    `prepare_features(t, c, o, max_length=256, regenerate=True)`.
    """
    cfg = cfglib.replace(config or CaptureConfig(), **overrides) if overrides else (config or CaptureConfig())
    check_config(cfg)
    out, conversations_path = Path(out_dir), Path(conversations_path)
    check_out_dir(out)
    # Regenerating, a turn waiting for an answer gets the target's, as `data regenerate` writes it (a file of
    # prompts alone is SpecForge's input for that); else such a conversation has nothing to train.
    convs, skipped = read_conversations(conversations_path, strict=cfg.strict, prompts=cfg.regenerate)
    if cfg.regenerate:
        convs = answerable(convs, skipped, conversations_path, cfg.strict)
    if not convs:
        turn = "a user or assistant" if cfg.regenerate else "an assistant"
        raise LabError(f"no conversation with {turn} turn (skipped: {skipped})", conversations_path)
    dtype = DTYPES[cfg.dtype]
    tp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    target = _load_tp_target(Path(target_path), dtype) if tp else load_target(target_path, device=cfg.device, dtype=dtype)
    main = _dist_rank() == 0
    aux_ids = check_aux_layer_ids(
        cfg.aux_layer_ids if cfg.aux_layer_ids is not None else default_aux_layer_ids(target.num_layers),
        target.num_layers,
        target.path,
    )
    existing = Manifest.load(out) if (out / MANIFEST).exists() else None
    # A template that reads the clock renders one day in every render of the run, recorded in its settings.
    cfg = cfglib.replace(cfg, chat_template_kwargs=pinned_by_rank0(target.tokenizer, cfg.chat_template_kwargs,
                                                                   _rendered_before(out, existing, convs)))
    source = _source(cfg, conversations_path, convs, target)
    describe = _described(target, out, existing, aux_ids, cfg.dtype, source)
    earlier = _earlier_settings(out, existing, resume_settings(describe, aux_ids, cfg.dtype, source))
    source = as_recorded(earlier, source, out)
    settings = resume_settings(describe, aux_ids, cfg.dtype, source)
    if existing is not None:
        check_resumable(out, existing, settings)
    if tp:  # every rank has read the manifest and cache before rank 0 writes anything
        torch.distributed.barrier()

    try:
        convs = _conversations(target, convs, cfg, out, settings, main)
    except LabError as e:  # a conversation's refusal to regenerate names it, and this names its file
        if e.path is not None:
            raise
        raise LabError(str(e), conversations_path) from None
    items = tokenize_conversations(target, convs, cfg, conversations_path, skipped, main)
    if not items:
        raise LabError(f"no sequence keeps an assistant token within max_length={cfg.max_length} (skipped: {skipped})",
                       conversations_path)
    manifest = Manifest(target=describe, aux_layer_ids=aux_ids, dtype=cfg.dtype, source=source, skipped=skipped)
    return write_planned(
        out, manifest, existing, plan_shards(items, cfg.val_fraction, cfg.shard_size), dtype, lambda it: len(it[1]),
        lambda chunk, advance, put: capture_states(target, chunk, aux_ids, dtype, cfg.batch_size, advance, put), main,
        holds=_holds_as_planned,
    )
