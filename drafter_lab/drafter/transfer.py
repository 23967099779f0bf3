"""Initialise a drafter from another drafter trained for another target (DESIGN "Transfer").

`(d2t, t2d, lm_head rows)` are one unit: a source drafter's lm_head row i predicts the source's
draft token i, which is target token used_src[i]. Under a new draft vocab, row i must predict
used_new[i], so lm_head is rebuilt row by row: the source row for that target token when the
source vocab has it, else the target model's own lm_head row for it. `remap=False` copies rows as
they are (the seeds' first, naive attempt: random-level loss because only a few hundred of 32,000
positions meant the same token in both mappings).

"Target token" means a token of the same bytes in both targets (tokenizer families write them
differently: byte-level BPE's 'Ã©' and sentencepiece's 'é' are both c3 a9). Where the two tokenizers agree (most
version bumps) that is the same id; where they differ (a new version's vocabulary, ids moved), the
new target's ids are translated through both vocabularies (`token_map`) before the lookup, and a
token the source's vocabulary lacks gets the target's row. The source target's tokenizer comes from
`--source-target`, or from the target the source's run.json names where it still lies there
unchanged (`source_tokens`); without either, ids are taken to name the same tokens, said in the
report where the two target vocabularies differ in size.

A drafter whose hidden size differs from its target's owns its token embedding, and takes the
source's: row by row through the same translation (a row whose token the source lacks starts
fresh). A drafter of the target's width embeds with the target's own.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from drafter_lab.drafter import formats
from drafter_lab.drafter.checkpoint import (
    check_shape,
    expected_shapes,
    read_checkpoint,
    recorded_fingerprint,
    recorded_target,
)
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError

SKIP_REASONS = {
    "d2t": "source draft->target mapping; the new draft vocab's mapping is used",
    "t2d": "source target->draft mask; the new draft vocab's mask is used",
    formats.EMBED: "token embedding is the new target's own (frozen)",
    formats.VERIFIER_TENSORS[0]: "the source verifier's head, not a drafter weight",
    formats.VERIFIER_TENSORS[1]: "the source verifier's norm, not a drafter weight",
}
FILLED_REASONS = {
    "d2t": "not in the source file (read as the identity); the new draft vocab's mapping is used",
    "t2d": "not in the source file (derived from its d2t); the new draft vocab's mask is used",
}


@dataclass
class TransferReport:
    """What init_from did, tensor by tensor and row by row."""

    source: str
    """Path of the source drafter."""
    source_format: str
    """Layout it was read as (sglang: midlayer.* names; speculators: layers.0.* names)."""
    remap: bool
    """Whether lm_head rows were re-indexed to the new draft vocab."""
    remap_by: str
    """"id" (the two targets' ids name the same tokens) or "token" (translated through both tokenizers)."""
    draft_vocab_size: int
    """N of the new drafter."""
    source_draft_vocab_size: int
    """N of the source drafter."""
    positions_agree: int
    """Draft positions i whose target token is the same in both mappings (the seeds' 252 / 32,000)."""
    tokens_shared: int
    """Target tokens present in both draft vocabularies."""
    rows_copied: int
    """lm_head rows taken from the source."""
    rows_from_target: int
    """lm_head rows filled from the target's own lm_head (tokens the source vocab lacks)."""
    loaded: list[dict] = field(default_factory=list)
    """Tensors loaded: {tensor, reason}."""
    skipped: list[dict] = field(default_factory=list)
    """Tensors skipped: {tensor, reason}."""
    notes: list[str] = field(default_factory=list)
    """Anything else worth knowing (e.g. the source used other aux layers)."""

    @property
    def transferred(self) -> list[str]:
        """Names of the drafter parameters that came from the source."""
        return [row["tensor"] for row in self.loaded]

    def to_json(self) -> dict:
        return asdict(self)

    def table(self):
        """A rich Table for the console."""
        from rich.table import Table

        remap = f"on, by {self.remap_by}" if self.remap else "off"
        t = Table(title=f"transfer from {self.source} ({self.source_format}, remap {remap})")
        t.add_column("item")
        t.add_column("value", justify="right")
        t.add_column("reason / detail")
        n = self.draft_vocab_size
        t.add_row("positions that already agree", f"{self.positions_agree} / {min(n, self.source_draft_vocab_size)}", "")
        t.add_row("tokens shared", f"{self.tokens_shared} / {n}", f"source N = {self.source_draft_vocab_size}")
        t.add_row("lm_head rows copied", str(self.rows_copied), "from the source")
        t.add_row("lm_head rows from target", str(self.rows_from_target), "target's own lm_head row")
        for row in self.loaded:
            t.add_row(f"loaded {row['tensor']}", "", row["reason"])
        for row in self.skipped:
            t.add_row(f"skipped {row['tensor']}", "", row["reason"])
        for note in self.notes:
            t.add_row("note", "", note)
        return t


def used_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target id of each draft id: i + d2t[i]."""
    d2t = d2t.long().cpu()
    return torch.arange(len(d2t)) + d2t


BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
"""A sentencepiece byte-fallback token: that one byte."""


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the byte each character of a byte-level vocabulary stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def _json_objects(node):
    """Every JSON object in a tokenizer.json component, those nested in a Sequence included."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            yield from _json_objects(child)


def _vocab_kind(tokenizer) -> str | None:
    """"byte_level" (GPT-2's byte alphabet), "metaspace" (sentencepiece's '▁' and <0xNN> tokens), or None
    (tokens are their own text), as the tokenizer's pre-tokenizer and decoder say. A python tokenizer
    (remote code, or a slow one) has no such pipeline: a GPT-2 `byte_decoder` (Kimi K2's tiktoken one)
    says byte-level, a sentencepiece `sp_model` (slow Llama's, Baichuan's; ChatGLM2/3's one level down, in
    the `SPTokenizer` at `tokenizer.tokenizer`, whose IdToPiece is its get_vocab()) says its pieces are
    sentencepiece's."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        if getattr(tokenizer, "byte_decoder", None) == _byte_level_alphabet():
            return "byte_level"
        held = (tokenizer, getattr(tokenizer, "tokenizer", None))
        return "metaspace" if any(getattr(t, "sp_model", None) is not None for t in held) else None
    spec = json.loads(backend.to_str())
    types = {o.get("type") for o in _json_objects([spec.get("pre_tokenizer"), spec.get("decoder")])}
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"Metaspace", "ByteFallback"} or (spec.get("model") or {}).get("byte_fallback"):
        return "metaspace"
    return None


def _kept_apart(tokenizer) -> dict[str, int]:
    """The special tokens a tiktoken tokenizer keeps out of both get_vocab() and get_added_vocab()
    (Qwen-1's `special_tokens`: its <|im_end|> would otherwise pair with nothing)."""
    special = getattr(tokenizer, "special_tokens", None)
    if not isinstance(special, dict):
        return {}
    return {t: i for t, i in special.items() if isinstance(t, str) and isinstance(i, int)}


def _vocab(tokenizer) -> dict[str | bytes, int]:
    """Every token and its id: get_vocab() and the special tokens kept apart from it."""
    return {**_kept_apart(tokenizer), **tokenizer.get_vocab()}


def _token_keys(tokenizer) -> tuple[dict[int, bytes | str], set[int]]:
    """Each id's bytes (what its token stands for in text); an added or special token's content string.
    And the ids of the byte-fallback tokens. A tiktoken vocabulary (Qwen-1's, remote code) is keyed by
    the tokens' bytes themselves."""
    kind = _vocab_kind(tokenizer)
    added = {*tokenizer.get_added_vocab().values(), *_kept_apart(tokenizer).values()}
    alphabet = _byte_level_alphabet()
    keys, fallbacks = {}, set()
    for token, i in _vocab(tokenizer).items():
        if isinstance(token, bytes):
            keys[i] = token
            continue
        fallback = BYTE_FALLBACK.fullmatch(token) if kind == "metaspace" else None
        if fallback:
            keys[i] = bytes([int(fallback[1], 16)])
            fallbacks.add(i)
        elif i in added:
            keys[i] = token
        elif kind == "byte_level" and all(c in alphabet for c in token):
            keys[i] = bytes(alphabet[c] for c in token)
        else:
            keys[i] = (token.replace("▁", " ") if kind == "metaspace" else token).encode()
    return keys, fallbacks


def token_map(source_tokenizer, new_tokenizer, vocab_size: int) -> torch.Tensor | None:
    """Each new-target id's id in the source target's vocabulary (a token of the same bytes; an added or
    special token of the same content), -1 where it has none or past the tokenizer (padding rows); None
    where the two vocabularies are the same, so that ids already name the same tokens. Where the source
    has two tokens of the same bytes (a byte-fallback <0x41> beside 'A'): the one of the same spelling,
    else its lowest id that is no byte fallback (the token its text is written with, which a drafter's
    vocab and embedding know)."""
    spelled, mine = _vocab(source_tokenizer), _vocab(new_tokenizer)
    if spelled == mine:
        return None
    src_keys, src_fallbacks = _token_keys(source_tokenizer)
    theirs: dict[bytes | str, int] = {}
    for i, key in sorted(src_keys.items(), key=lambda item: (item[0] in src_fallbacks, item[0])):
        theirs.setdefault(key, i)
    new_keys, _ = _token_keys(new_tokenizer)
    out = torch.full((vocab_size,), -1, dtype=torch.long)
    for token, i in mine.items():
        if i < vocab_size:
            same = spelled.get(token)
            out[i] = same if same is not None and src_keys[same] == new_keys[i] else theirs.get(new_keys[i], -1)
    return out


def check_source_target(source_path, source_target) -> None:
    """Refuse a `--source-target` whose weights are not those the source drafter's run.json records: its
    tokenizer would remap by another vocabulary, and the probe's home signals measure another model,
    silently. A directory without weights (a tokenizer alone) or a drafter without a run record
    cannot be checked and is taken as given."""
    from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint, weight_files

    recorded, given = recorded_fingerprint(source_path), Path(source_target)
    if recorded is None or not (given / "config.json").is_file() or not weight_files(given):
        return
    if recorded not in (fingerprint(given), legacy_fingerprint(given)):
        raise LabError(f"--source-target {given} is not the target this drafter was trained on: its run.json "
                       f"records {recorded}, that directory is {fingerprint(given)} (pass the drafter's own "
                       "target, or leave --source-target out)", source_path)


def source_tokens(source_path, source_target, target) -> tuple[torch.Tensor | None, str | None]:
    """The token map from `target` to the source drafter's target, and how it was found (None, None
    where no tokenizer of the source's target is at hand). `source_target`: its directory (checked
    against the run record, `check_source_target`); else the one the source's run.json names, if it
    still holds the weights it names (the fingerprint)."""
    from drafter_lab.targets.fingerprint import fingerprint, legacy_fingerprint
    from drafter_lab.targets.hf import load_tokenizer

    if source_target is not None:
        check_source_target(source_path, source_target)
        return token_map(load_tokenizer(source_target), load_tokenizer(target.path), target.vocab_size), \
            "--source-target"
    recorded = recorded_fingerprint(source_path)
    named = recorded_target(source_path, "path") if recorded else None
    if not named or not (Path(named) / "config.json").is_file():
        return None, None
    # Found, not asked for: weights it can no longer read (a dangling link) or no tokenizer, and the
    # transfer goes on by id, as before.
    try:
        if recorded != fingerprint(named) and recorded != legacy_fingerprint(named):
            return None, None
        tokens = token_map(load_tokenizer(named), load_tokenizer(target.path), target.vocab_size)
    except LabError:
        return None, None
    return tokens, f"the target its run.json names, {named}"


@torch.no_grad()
def init_from(drafter: Eagle3Drafter, source_path, target, new_vocab, remap: bool = True,
              tokens: torch.Tensor | None = None, tokens_from: str | None = None) -> TransferReport:
    """Load a source drafter's weights into `drafter` (already built for the new target and vocab).

    `target` has `lm_head_weight()` (drafter_lab.targets.hf.Target); `new_vocab` has `d2t`/`t2d`.
    `tokens` (token_map, found as `tokens_from` says) translates the new target's ids to the
    source's; None: they name the same tokens.
    """
    ckpt = read_checkpoint(source_path)
    mine, theirs = drafter.config.norm_before_residual, ckpt.config.norm_before_residual
    if mine != theirs:
        raise LabError(f"the source drafter has norm_before_residual={str(theirs).lower()}, this one "
                       f"{str(mine).lower()}: its weights work with its own residual (train with --draft-config "
                       f"{Path(source_path) / 'config.json'}, or --drafter-norm-before-residual {str(theirs).lower()})",
                       source_path)
    if drafter.config.rope_scaling != ckpt.config.rope_scaling:
        theirs = formats.rope_scaling_text(ckpt.config.rope_scaling)
        raise LabError(f"the source drafter's RoPE scaling is {theirs or 'none'}, this one's "
                       f"{formats.rope_scaling_text(drafter.config.rope_scaling) or 'none'}: its attention weights work with "
                       f"its own positions (train with --draft-config {Path(source_path) / 'config.json'}, or "
                       f"--drafter-rope-scaling '{theirs}')", source_path)
    src = ckpt.tensors
    heads = [(c.num_attention_heads, c.num_key_value_heads, c.head_dim) for c in (ckpt.config, drafter.config)]
    if heads[0] != heads[1]:  # equal widths (8 x 8 against 4 x 16) would copy q/k/v/o cut into other heads
        (h, kv, d), (h2, kv2, d2) = heads
        raise LabError(f"the source drafter's attention is {h} heads ({kv} kv) of {d}, this one's {h2} ({kv2}) of {d2}: "
                       f"its weights split into its own heads (train with --draft-config {Path(source_path) / 'config.json'})",
                       source_path)
    shapes = expected_shapes(drafter.config)
    new_d2t = torch.as_tensor(new_vocab.d2t).long()
    used_new = used_ids(new_d2t)
    used_src = used_ids(src["d2t"])
    as_src = used_new if tokens is None else tokens[used_new]  # each new draft token's source id (-1: none)
    n_new, n_src = len(used_new), len(used_src)
    if n_new != drafter.config.draft_vocab_size:
        raise LabError(f"new vocab has {n_new} entries, the drafter {drafter.config.draft_vocab_size}")
    m = min(n_new, n_src)
    shared = set(used_src.tolist()) & set(as_src.tolist())
    report = TransferReport(
        source=str(source_path),
        source_format=ckpt.format,
        remap=remap,
        remap_by="id" if tokens is None else "token",
        draft_vocab_size=n_new,
        source_draft_vocab_size=n_src,
        positions_agree=int((used_src[:m] == as_src[:m]).sum()),
        tokens_shared=len(shared),
        rows_copied=0,
        rows_from_target=0,
    )
    if tokens is not None:
        moved, absent = int(((as_src != used_new) & (as_src >= 0)).sum()), int((as_src < 0).sum())
        report.notes.append(f"the two targets' tokenizers differ (found through {tokens_from}): remapped by token "
                            f"string (of the {n_new} draft tokens, {moved} under another id there, {absent} absent "
                            "from it)")
    elif ckpt.config.target_vocab_size != drafter.config.target_vocab_size and tokens_from is not None:
        report.notes.append(f"the source's target has {ckpt.config.target_vocab_size} tokens, this one "
                            f"{drafter.config.target_vocab_size}, with the same tokenizer (found through {tokens_from}): "
                            "ids name the same tokens")
    elif ckpt.config.target_vocab_size != drafter.config.target_vocab_size:
        report.notes.append(f"the source's target has {ckpt.config.target_vocab_size} tokens, this one "
                            f"{drafter.config.target_vocab_size}, and no tokenizer of the source's target is at hand: "
                            "ids are taken to name the same tokens (pass --source-target to remap by token)")
    want_aux, have_aux = list(drafter.config.aux_layer_ids), list(ckpt.config.aux_layer_ids)
    if have_aux and want_aux and have_aux != want_aux:
        report.notes.append(f"source fc was trained on aux layers {have_aux}; the new drafter reads {want_aux}")
    # a new target version may change these (unlike the RoPE scaling, refused above): told, not refused
    for key, why in (("rope_theta", "attention weights were trained under another RoPE"),
                     ("max_position_embeddings", "the source was configured for another context length")):
        theirs, mine = getattr(ckpt.config, key), getattr(drafter.config, key)
        if theirs != mine:
            report.notes.append(f"{key} {theirs:.15g} -> {mine:.15g}: {why}")

    params = dict(drafter.named_parameters())
    for name in sorted(src):
        tensor = src[name]
        where = ckpt.where.get(name, ckpt.path)
        reason = FILLED_REASONS[name] if name in ckpt.filled else SKIP_REASONS.get(name)
        if name == formats.EMBED and drafter.config.own_embedding:
            have, want = tuple(tensor.shape), shapes[name]
            by = tokens
            if by is None and tokens_from is not None and have != want:  # the same tokenizer over another row count
                by = torch.arange(want[0])  # ids name the same tokens
            if by is not None and have[1:] == want[1:]:
                has = (by >= 0) & (by < have[0])
                params[name][has] = tensor[by[has]].to(params[name].dtype)
                how = "by token string" if tokens is not None else "by id (the same tokenizer)"
                report.loaded.append({"tensor": name, "reason": f"rows of the {int(has.sum())} tokens the source's "
                                      f"vocabulary has, {how}; the others start fresh"})
                continue
            reason = None if have == want else f"shape {have}, this drafter's own embedding is {want}: it starts fresh"
        if reason is not None:
            report.skipped.append({"tensor": name, "reason": reason})
            continue
        if name not in params:
            raise LabError(f"unexpected tensor {name!r}: not part of an EAGLE-3 drafter", where)
        if name == formats.HEAD:
            rows = _lm_head(tensor, used_src, used_new, as_src, target, drafter, remap, report, where)
            params[name].copy_(rows.to(params[name].dtype))
            continue
        check_shape(formats.export_name(name, ckpt.format), tensor, shapes[name], where)
        params[name].copy_(tensor.to(params[name].dtype))
        report.loaded.append({"tensor": name, "reason": "copied"})
    if not ckpt.has_head:  # it shares its target's head, which is not at hand: this target's serves it
        report.rows_from_target = len(used_new)
        report.skipped.append({"tensor": formats.HEAD,
                               "reason": "absent: the source shares its target's head, so every row is this target's"})
        rows = _target_rows(target, used_new, drafter.config.hidden_size, ckpt.weights_file())
        params[formats.HEAD].copy_(rows.to(params[formats.HEAD].dtype))
    if drafter.config.own_embedding and formats.EMBED not in src:  # EAGLE releases often leave it out
        report.skipped.append({"tensor": formats.EMBED,
                               "reason": "absent from the source file: this drafter's own embedding starts fresh"})
    drafter.d2t.copy_(new_d2t.to(drafter.d2t.device))
    drafter.t2d.copy_(torch.as_tensor(new_vocab.t2d).bool().to(drafter.t2d.device))
    return report


def _lm_head(rows_src, used_src, used_new, as_src, target, drafter, remap, report, where) -> torch.Tensor:
    hidden = drafter.config.hidden_size
    if rows_src.shape[1] != hidden:
        raise LabError(f"tensor 'lm_head.weight' has width {rows_src.shape[1]}, the drafter needs {hidden}", where)
    if not remap:
        if rows_src.shape[0] != len(used_new):  # said as the flags that differ, not as a shape the file has wrong
            raise LabError(f"--no-remap copies lm_head.weight's rows as they are, but the source drafter has "
                           f"{rows_src.shape[0]} draft rows and this run's draft vocab {len(used_new)}: train with "
                           f"--draft-vocab-size {rows_src.shape[0]}, or leave --no-remap out to remap them", where)
        report.rows_copied = len(used_new)
        report.loaded.append({"tensor": "lm_head.weight", "reason": "rows copied as-is (--no-remap): not re-indexed"})
        return rows_src
    src_row = {tok: i for i, tok in enumerate(used_src.tolist())}
    picks = torch.tensor([src_row.get(tok, -1) for tok in as_src.tolist()], dtype=torch.long)
    have = picks >= 0
    out = torch.empty(len(used_new), hidden, dtype=torch.float32)
    out[have] = rows_src[picks[have]].float()
    missing = int((~have).sum())
    if missing:
        out[~have] = _target_rows(target, used_new[~have], hidden, where)
    report.rows_copied = int(have.sum())
    report.rows_from_target = missing
    report.loaded.append(
        {
            "tensor": "lm_head.weight",
            "reason": f"re-indexed to the new draft vocab: {report.rows_copied} rows from the source, "
            f"{missing} from the target's lm_head",
        }
    )
    return out


def _target_rows(target, tokens: torch.Tensor, hidden: int, where) -> torch.Tensor:
    head = target.lm_head_weight().detach().cpu()
    if head.shape[1] != hidden:
        raise LabError(
            f"{len(tokens)} lm_head rows need the target's lm_head, but it has width {head.shape[1]} and "
            f"the drafter hidden size is {hidden} (H != H_target): cannot fill them",
            where,
        )
    return head[tokens].float()
